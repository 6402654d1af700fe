//! The deployment files say what the agent will actually accept: the config shipped in the
//! DaemonSet's ConfigMap validates, and the systemd unit runs commands that exist.

use reactor::config::Config;

const MANIFEST: &str = include_str!("../../deploy/kubernetes/reactor.yaml");
const UNIT: &str = include_str!("../../deploy/systemd/reactor.service");

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

#[test]
fn systemd_unit_runs_existing_subcommands() {
    let exec: Vec<&str> = UNIT
        .lines()
        .filter(|l| l.starts_with("ExecStart"))
        .collect();
    assert_eq!(exec.len(), 2);
    for line in exec {
        // The subcommand words (up to the first flag or path) must name a real subcommand;
        // `--help` proves clap knows it without needing the files the unit points at.
        let words: Vec<&str> = line
            .split_whitespace()
            .skip(1)
            .take_while(|a| !a.starts_with('-') && !a.starts_with('/'))
            .collect();
        assert!(!words.is_empty(), "{line}");
        let out = std::process::Command::new(reactor_tests::reactor_bin())
            .args(&words)
            .arg("--help")
            .output()
            .expect("run reactor");
        assert!(
            out.status.success(),
            "{line}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
