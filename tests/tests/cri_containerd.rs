//! scratch
use reactor_tests::{containerd_available, require, Containerd};

#[tokio::test]
async fn version() {
    if !require(containerd_available(), "root and containerd") {
        return;
    }
    let t = std::time::Instant::now();
    let ctd = Containerd::start("version").expect("start containerd");
    eprintln!("started in {:?}", t.elapsed());
    let client = ctd.client().await;
    let v = client.version().await.expect("version");
    eprintln!("{v:?}");
    eprintln!("{:?}", client.status().await);
    eprintln!("{:?}", client.cgroup_driver().await);
    eprintln!("{:?}", client.list_images().await);
    eprintln!("{:?}", client.image_fs_info().await);
    eprintln!("{}", ctd.log_tail());
}
