//! Kernel OOM kills mapped to the pod and container they hit.
//!
//! An OOM kill the agent did not prevent is a fact to record, not a decision: the kernel
//! already chose and killed. The event names the victim's memory cgroup (eBPF captures it in
//! the kernel; memcg notifications name the watched cgroup), and the pod cgroup layout
//! `…/kubepods[/<qos>]/pod<uid>/<container>` says whose it was.

/// The pod uid and container name a cgroup path points into, if it is below a pod cgroup.
/// `container` is `None` for the pod cgroup itself.
pub fn pod_of_cgroup(cgroup: &str) -> Option<(&str, Option<&str>)> {
    let mut parts = cgroup.split('/').filter(|p| !p.is_empty());
    // The pod cgroup is the first `pod<uid>` component after `kubepods`.
    parts.by_ref().find(|p| *p == "kubepods")?;
    let uid = loop {
        let p = parts.next()?;
        if let Some(uid) = p.strip_prefix("pod") {
            if !uid.is_empty() {
                break uid;
            }
        }
        if p != "burstable" && p != "besteffort" {
            return None;
        }
    };
    Some((uid, parts.next()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_pod_and_container() {
        assert_eq!(
            pod_of_cgroup("/node/kubepods/besteffort/podabc/hog"),
            Some(("abc", Some("hog")))
        );
        assert_eq!(
            pod_of_cgroup("/kubepods/podg-1/app"),
            Some(("g-1", Some("app")))
        );
        assert_eq!(pod_of_cgroup("/kubepods/burstable/podx"), Some(("x", None)));
        assert_eq!(pod_of_cgroup("/kubepods"), None);
        assert_eq!(pod_of_cgroup("/system.slice/podman/x"), None);
        assert_eq!(pod_of_cgroup("/kubepods/other/podx/c"), None);
    }
}
