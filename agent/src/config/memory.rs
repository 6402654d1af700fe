//! The kubelet's Memory QoS and swap keys: `featureGates.MemoryQoS`,
//! `memoryThrottlingFactor`, `memorySwap.swapBehavior` and `failSwapOn`, checked as the
//! kubelet v1.34 checks them (`pkg/kubelet/apis/config/validation/validation.go`, and
//! `failSwapOn` at start in `pkg/kubelet/cm/container_manager_linux.go`). The values
//! themselves are used by `decide::memory_qos`.

use super::{Config, ConfigError};
use crate::decide::memory_qos::SwapBehavior;

impl Config {
    /// Whether the `MemoryQoS` feature gate is on.
    pub fn memory_qos(&self) -> bool {
        self.feature_gates
            .get("MemoryQoS")
            .copied()
            .unwrap_or(false)
    }

    /// The swap behavior (validated at load, so an unknown name reads as NoSwap here).
    pub fn swap_behavior(&self) -> SwapBehavior {
        SwapBehavior::parse(&self.memory_swap.swap_behavior).unwrap_or_default()
    }

    /// Refuses the Memory QoS and swap values the kubelet refuses, naming the key.
    pub(super) fn validate_memory_qos(&self) -> Result<(), ConfigError> {
        let factor = self.memory_throttling_factor;
        // `!(a && b)` also refuses NaN.
        if !(factor > 0.0 && factor <= 1.0) {
            return Err(ConfigError::invalid(
                "memoryThrottlingFactor",
                format!("{factor} must be greater than 0 and at most 1.0"),
            ));
        }
        let behavior = &self.memory_swap.swap_behavior;
        if SwapBehavior::parse(behavior).is_none() {
            return Err(ConfigError::invalid(
                "memorySwap.swapBehavior",
                format!("{behavior:?} is not NoSwap or LimitedSwap"),
            ));
        }
        if self.feature_gates.get("NodeSwap") == Some(&false) {
            return Err(ConfigError::invalid(
                "featureGates.NodeSwap",
                "cannot be false: the gate is GA and locked to true (Kubernetes v1.34)",
            ));
        }
        Ok(())
    }

    /// The kubelet's start-time swap check (`NewContainerManager`): with `failSwapOn` (the
    /// default) a node with swap is refused, since the kubelet's (and this agent's) memory
    /// accounting counts no swap. The kubelet asks `/proc/swaps` for an active swap device;
    /// `swap_total_bytes` is the kernel's `SwapTotal`, above 0 exactly when one is on.
    pub fn check_fail_swap_on(&self, swap_total_bytes: u64) -> Result<(), ConfigError> {
        if self.fail_swap_on && swap_total_bytes > 0 {
            return Err(ConfigError::invalid(
                "failSwapOn",
                format!(
                    "the node has swap on ({} KiB in /proc/meminfo SwapTotal); turn swap off, \
                     or set failSwapOn: false to run with it",
                    swap_total_bytes / 1024
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_keys_are_read_and_checked() {
        let c = Config::from_yaml(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             featureGates: {MemoryQoS: true}\nmemoryThrottlingFactor: 0.8\n\
             memorySwap: {swapBehavior: LimitedSwap}\nfailSwapOn: false\n",
        )
        .unwrap();
        assert!(c.memory_qos());
        assert_eq!(c.memory_throttling_factor, 0.8);
        assert_eq!(c.swap_behavior(), SwapBehavior::LimitedSwap);
        assert!(!c.fail_swap_on);
        let d = Config::default();
        assert!(!d.memory_qos());
        assert_eq!(d.memory_throttling_factor, 0.9);
        assert_eq!(d.swap_behavior(), SwapBehavior::NoSwap);
        assert!(d.fail_swap_on);
    }

    #[test]
    fn bad_values_name_their_key() {
        for (doc, key) in [
            ("memoryThrottlingFactor: 0", "memoryThrottlingFactor"),
            ("memoryThrottlingFactor: 1.5", "memoryThrottlingFactor"),
            (
                "memorySwap: {swapBehavior: UnlimitedSwap}",
                "memorySwap.swapBehavior",
            ),
            ("memorySwap: {swapLimit: 1}", "memorySwap"),
            ("featureGates: {NodeSwap: false}", "featureGates.NodeSwap"),
            ("featureGates: {MemoryQoS: maybe}", "featureGates.MemoryQoS"),
        ] {
            let err = Config::from_yaml(doc).unwrap_err().to_string();
            assert!(
                err.starts_with(&format!("config key {key}")),
                "{doc}: {err}"
            );
            assert!(!err.contains('\n'), "{err}");
        }
    }

    #[test]
    fn fail_swap_on_refuses_a_node_with_swap() {
        let c = Config::default();
        assert!(c.check_fail_swap_on(0).is_ok());
        let err = c.check_fail_swap_on(1 << 30).unwrap_err().to_string();
        assert!(
            err.starts_with("config key failSwapOn: the node has swap on (1048576 KiB"),
            "{err}"
        );
        let off = Config {
            fail_swap_on: false,
            ..Config::default()
        };
        assert!(off.check_fail_swap_on(1 << 30).is_ok());
    }
}
