//! KEP-5394's keys: `featureGates.PSINodeCondition` and the four PSI thresholds, named as in
//! the kubelet's KubeletConfiguration (kubernetes/kubernetes PR #137357, v1.36 alpha). The
//! rule they feed is `decide::psi_conditions`.

use super::{Config, ConfigError};
use crate::decide::psi_conditions::{PsiSettings, THRESHOLD_KEYS};

impl Config {
    /// Whether the `PSINodeCondition` feature gate is on (off by default).
    pub(crate) fn psi_node_condition(&self) -> bool {
        self.feature_gates
            .get("PSINodeCondition")
            .copied()
            .unwrap_or(false)
    }

    /// The gate and the thresholds, as `decide` takes them.
    pub(crate) fn psi_settings(&self) -> PsiSettings {
        PsiSettings {
            enabled: self.psi_node_condition(),
            thresholds: self.psi_thresholds(),
        }
    }

    fn psi_thresholds(&self) -> [f64; 4] {
        [
            self.system_memory_contention_threshold,
            self.system_disk_contention_threshold,
            self.kubepods_memory_contention_threshold,
            self.kubepods_disk_contention_threshold,
        ]
    }

    /// Refuses a threshold that is not a percentage from 0 to 100, naming its key.
    pub(super) fn validate_psi_conditions(&self) -> Result<(), ConfigError> {
        for (key, value) in THRESHOLD_KEYS.iter().zip(self.psi_thresholds()) {
            PsiSettings::check_threshold(value)
                .map_err(|e| ConfigError::invalid(*key, e.to_string()))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_is_off_by_default_and_read_from_a_kubelet_file() {
        let d = Config::default();
        assert!(!d.psi_node_condition());
        assert_eq!(d.psi_settings(), PsiSettings::default());
        let (c, ignored) = Config::from_yaml_reporting(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             featureGates: {PSINodeCondition: true}\nsystemMemoryContentionThreshold: 0.5\n\
             systemDiskContentionThreshold: 2\nkubepodsMemoryContentionThreshold: 0\n\
             kubepodsDiskContentionThreshold: 10.25\n",
        )
        .unwrap();
        assert!(ignored.is_empty(), "{ignored:?}");
        let s = c.psi_settings();
        assert!(s.enabled);
        assert_eq!(s.thresholds, [0.5, 2.0, 0.0, 10.25]);
    }

    #[test]
    fn bad_thresholds_name_their_key_on_one_line() {
        for (doc, key) in [
            (
                "systemMemoryContentionThreshold: -1",
                "systemMemoryContentionThreshold",
            ),
            (
                "systemDiskContentionThreshold: 101",
                "systemDiskContentionThreshold",
            ),
            (
                "kubepodsMemoryContentionThreshold: 1e3",
                "kubepodsMemoryContentionThreshold",
            ),
            (
                "kubepodsDiskContentionThreshold: high",
                "kubepodsDiskContentionThreshold",
            ),
            (
                "featureGates: {PSINodeCondition: maybe}",
                "featureGates.PSINodeCondition",
            ),
        ] {
            let err = Config::from_yaml(doc).unwrap_err().to_string();
            assert!(
                err.starts_with(&format!("config key {key}")),
                "{doc}: {err}"
            );
            assert!(!err.contains('\n'), "{err}");
        }
    }
}
