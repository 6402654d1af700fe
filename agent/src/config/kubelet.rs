//! Pasting a kubelet's config file: `apiVersion`/`kind` of a `KubeletConfiguration` are
//! accepted (and checked), and the KubeletConfiguration fields this agent has no use for
//! (TLS, DNS, the API server client, CPU manager, ...) are set aside with their names
//! reported, so an operator's file works unchanged. Anything that is neither an agent key nor
//! a KubeletConfiguration field is still refused, with its path: a typo must not pass for a
//! kubelet setting.

use serde_json::Value;

use super::error::ConfigError;

/// The `apiVersion` of the kubelet's config file.
pub(crate) const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
/// Its `kind`.
pub(crate) const KIND: &str = "KubeletConfiguration";

/// Every top-level field of `KubeletConfiguration` (`kubelet.config.k8s.io/v1beta1`). The ones
/// the agent's own config also defines are read by it; the rest are ignored.
const FIELDS: &[&str] = &[
    "enableServer",
    "staticPodPath",
    "podLogsDir",
    "syncFrequency",
    "fileCheckFrequency",
    "httpCheckFrequency",
    "staticPodURL",
    "staticPodURLHeader",
    "address",
    "port",
    "readOnlyPort",
    "tlsCertFile",
    "tlsPrivateKeyFile",
    "tlsCipherSuites",
    "tlsMinVersion",
    "rotateCertificates",
    "serverTLSBootstrap",
    "authentication",
    "authorization",
    "registryPullQPS",
    "registryBurst",
    "imagePullCredentialsVerificationPolicy",
    "preloadedImagesVerificationAllowlist",
    "eventRecordQPS",
    "eventBurst",
    "enableDebuggingHandlers",
    "enableContentionProfiling",
    "healthzPort",
    "healthzBindAddress",
    "oomScoreAdj",
    "clusterDomain",
    "clusterDNS",
    "streamingConnectionIdleTimeout",
    "nodeStatusUpdateFrequency",
    "nodeStatusReportFrequency",
    "nodeLeaseDurationSeconds",
    "imageMinimumGCAge",
    "imageMaximumGCAge",
    "imageGCHighThresholdPercent",
    "imageGCLowThresholdPercent",
    "volumeStatsAggPeriod",
    "kubeletCgroups",
    "systemCgroups",
    "cgroupRoot",
    "cgroupsPerQOS",
    "cgroupDriver",
    "cpuManagerPolicy",
    "singleProcessOOMKill",
    "cpuManagerPolicyOptions",
    "cpuManagerReconcilePeriod",
    "memoryManagerPolicy",
    "topologyManagerPolicy",
    "topologyManagerScope",
    "topologyManagerPolicyOptions",
    "qosReserved",
    "runtimeRequestTimeout",
    "hairpinMode",
    "maxPods",
    "podCIDR",
    "podPidsLimit",
    "resolvConf",
    "runOnce",
    "cpuCFSQuota",
    "cpuCFSQuotaPeriod",
    "nodeStatusMaxImages",
    "maxOpenFiles",
    "contentType",
    "kubeAPIQPS",
    "kubeAPIBurst",
    "serializeImagePulls",
    "maxParallelImagePulls",
    "evictionHard",
    "evictionSoft",
    "evictionSoftGracePeriod",
    "evictionPressureTransitionPeriod",
    "evictionMaxPodGracePeriod",
    "evictionMinimumReclaim",
    "mergeDefaultEvictionSettings",
    "podsPerCore",
    "enableControllerAttachDetach",
    "protectKernelDefaults",
    "makeIPTablesUtilChains",
    "iptablesMasqueradeBit",
    "iptablesDropBit",
    "featureGates",
    "failSwapOn",
    "memorySwap",
    "containerLogMaxSize",
    "containerLogMaxFiles",
    "containerLogMaxWorkers",
    "containerLogMonitorInterval",
    "configMapAndSecretChangeDetectionStrategy",
    "systemReserved",
    "kubeReserved",
    "reservedSystemCPUs",
    "showHiddenMetricsForVersion",
    "systemReservedCgroup",
    "kubeReservedCgroup",
    "enforceNodeAllocatable",
    "allowedUnsafeSysctls",
    "volumePluginDir",
    "providerID",
    "kernelMemcgNotification",
    "logging",
    "enableSystemLogHandler",
    "enableSystemLogQuery",
    "shutdownGracePeriod",
    "shutdownGracePeriodCriticalPods",
    "shutdownGracePeriodByPodPriority",
    "crashLoopBackOff",
    "reservedMemory",
    "enableProfilingHandler",
    "enableDebugFlagsHandler",
    "seccompDefault",
    "memoryThrottlingFactor",
    "registerWithTaints",
    "registerNode",
    "tracing",
    "localStorageCapacityIsolation",
    "containerRuntimeEndpoint",
    "imageServiceEndpoint",
    "failCgroupV1",
    "userNamespaces",
    // KEP-5394 (alpha in v1.36, kubernetes/kubernetes PR #137357).
    "systemMemoryContentionThreshold",
    "systemDiskContentionThreshold",
    "kubepodsMemoryContentionThreshold",
    "kubepodsDiskContentionThreshold",
];

/// Checks `apiVersion`/`kind` when present and removes them, then removes the
/// KubeletConfiguration fields the agent does not define (`own` holds the keys it does).
/// Returns the names set aside, sorted.
pub(crate) fn set_aside(document: &mut Value, own: &[String]) -> Result<Vec<String>, ConfigError> {
    let Some(map) = document.as_object_mut() else {
        return Ok(Vec::new());
    };
    for (key, want) in [("apiVersion", API_VERSION), ("kind", KIND)] {
        if let Some(v) = map.remove(key) {
            if v.as_str() != Some(want) {
                return Err(ConfigError::invalid(
                    key,
                    format!("{v} is not {want:?} (a kubelet config file, or none at all)"),
                ));
            }
        }
    }
    let mut ignored: Vec<String> = map
        .keys()
        .filter(|k| FIELDS.contains(&k.as_str()) && !own.iter().any(|o| o == *k))
        .cloned()
        .collect();
    ignored.sort();
    for k in &ignored {
        map.remove(k);
    }
    Ok(ignored)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kubelet_only_fields_are_set_aside_and_the_rest_kept() {
        let mut doc = json!({"apiVersion": API_VERSION, "kind": KIND,
            "clusterDNS": ["10.0.0.10"], "evictionHard": {"memory.available": "1Gi"},
            "notAField": 1});
        let ignored = set_aside(&mut doc, &["evictionHard".to_string()]).unwrap();
        assert_eq!(ignored, ["clusterDNS"]);
        assert_eq!(
            doc,
            json!({"evictionHard": {"memory.available": "1Gi"}, "notAField": 1})
        );
    }

    #[test]
    fn a_wrong_kind_or_api_version_names_the_key() {
        for (key, value) in [("kind", "Pod"), ("apiVersion", "v1")] {
            let mut doc = json!({key: value});
            let err = set_aside(&mut doc, &[]).unwrap_err().to_string();
            assert!(err.starts_with(&format!("config key {key}: ")), "{err}");
        }
    }
}
