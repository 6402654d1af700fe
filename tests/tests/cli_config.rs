//! `reactor config`: defaults print and re-validate; malformed files exit 2 naming the field.

use std::process::Command;

use reactor_tests::reactor_bin;

fn reactor(args: &[&str]) -> std::process::Output {
    Command::new(reactor_bin())
        .args(args)
        .output()
        .expect("run reactor")
}

#[test]
fn defaults_validate_with_check() {
    let out = reactor(&["config", "defaults"]);
    assert!(out.status.success());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("defaults.yaml");
    std::fs::write(&file, &out.stdout).unwrap();
    let check = reactor(&["config", "check", file.to_str().unwrap()]);
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
}

/// `memoryReclaim` (reclaim before a memory eviction, the agent's own key) is shown off by
/// default with its time bound, and an enabled one passes the check.
#[test]
fn memory_reclaim_defaults_off_and_checks() {
    let out = reactor(&["config", "defaults"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("memoryReclaim:\n  enabled: false\n  timeout: 100ms\n"),
        "{text}"
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("on.yaml");
    std::fs::write(&file, "memoryReclaim:\n  enabled: true\n  timeout: 250ms\n").unwrap();
    let check = reactor(&["config", "check", file.to_str().unwrap()]);
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
}

#[test]
fn malformed_config_exits_2_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    for (text, field) in [
        ("sense:\n  kernelMagic: true\n", "kernelMagic"),
        ("housekeepingInterval: -10s\n", "housekeepingInterval"),
        ("sense:\n  psiWindow: 0s\n", "sense.psiWindow"),
        (
            "imageGCHighThresholdPercent: 101\n",
            "imageGCHighThresholdPercent",
        ),
        (
            "memoryReclaim:\n  enabled: true\n  timeout: 0s\n",
            "memoryReclaim.timeout",
        ),
        ("memoryReclaim:\n  timeout: 1m\n", "memoryReclaim.timeout"),
        ("memoryReclaim:\n  enabled: yes please\n", "memoryReclaim"),
    ] {
        let file = dir.path().join("bad.yaml");
        std::fs::write(&file, text).unwrap();
        let out = reactor(&["config", "check", file.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{text}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
        assert!(err.contains(field), "{text}: {err}");
    }
}

/// A kubelet's config file as kubeadm writes it, with eviction and image GC settings: the
/// agent takes it unchanged, uses what it shares with the kubelet, and names the rest.
const KUBELET_CONFIG: &str = "\
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous:
    enabled: false
  webhook:
    cacheTTL: 0s
    enabled: true
  x509:
    clientCAFile: /etc/kubernetes/pki/ca.crt
authorization:
  mode: Webhook
cgroupDriver: cgroupfs
clusterDNS:
- 10.96.0.10
clusterDomain: cluster.local
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
evictionHard:
  memory.available: 200Mi
  nodefs.available: 10%
  imagefs.available: 15%
evictionSoft:
  memory.available: 500Mi
evictionSoftGracePeriod:
  memory.available: 1m30s
evictionMinimumReclaim:
  memory.available: 100Mi
evictionPressureTransitionPeriod: 5m0s
evictionMaxPodGracePeriod: 60
imageGCHighThresholdPercent: 80
imageGCLowThresholdPercent: 70
imageMinimumGCAge: 2m0s
imageMaximumGCAge: 168h
systemReserved:
  memory: 512Mi
kubeReserved:
  memory: 256Mi
enforceNodeAllocatable:
- pods
rotateCertificates: true
staticPodPath: /etc/kubernetes/manifests
streamingConnectionIdleTimeout: 0s
syncFrequency: 0s
";

#[test]
fn a_kubelet_config_file_is_accepted_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("kubelet.yaml");
    std::fs::write(&file, KUBELET_CONFIG).unwrap();
    let out = reactor(&["config", "check", file.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ignored = stdout
        .lines()
        .find_map(|l| {
            l.strip_prefix("KubeletConfiguration fields not used by the agent (ignored): ")
        })
        .unwrap_or_else(|| panic!("{stdout}"));
    let ignored: Vec<&str> = ignored.split(", ").collect();
    assert_eq!(
        ignored,
        [
            "authentication",
            "authorization",
            "clusterDNS",
            "clusterDomain",
            "containerRuntimeEndpoint",
            "rotateCertificates",
            "streamingConnectionIdleTimeout",
            "syncFrequency"
        ]
    );
    // The shared settings are the agent's: the same thresholds `plan pressure` reads.
    let config = reactor::config::Config::from_yaml(KUBELET_CONFIG).unwrap();
    assert_eq!(config.eviction_hard["memory.available"], "200Mi");
    assert_eq!(config.eviction_hard["imagefs.available"], "15%");
    assert_eq!(config.image_gc_high_threshold_percent, 80);
    assert_eq!(config.eviction_max_pod_grace_period, 60);
    assert_eq!(config.static_pod_path, "/etc/kubernetes/manifests");

    // A typo is still refused with its key, and so is another kind of document.
    for (text, key) in [
        (
            KUBELET_CONFIG.replace("evictionHard:", "evictionHrad:"),
            "evictionHrad",
        ),
        (
            KUBELET_CONFIG.replace("kind: KubeletConfiguration", "kind: Pod"),
            "kind",
        ),
    ] {
        std::fs::write(&file, text).unwrap();
        let out = reactor(&["config", "check", file.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(&format!("config key {key}")), "{err}");
    }
}
