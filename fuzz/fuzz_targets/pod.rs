//! A pod document as the agent accepts it (`ApplyPod` over the API, `reactor pod apply`, a
//! static manifest; JSON or YAML): parsed, checked, and turned into what the runtime runs.
#![no_main]

use std::collections::BTreeMap;
use std::sync::OnceLock;

use k8s_openapi::api::core::v1 as k8s;
use libfuzzer_sys::fuzz_target;
use reactor::act::pod_spec::pod_spec;
use reactor::config::Config;
use reactor::decide::cgroups::{CgroupVersion, NodeSettings};
use reactor::node::document::{self, Format};
use reactor::node::NodePlan;
use reactor_fuzz::one_line;

/// The cgroup settings of a small v2 node, as `reactor run` derives them from its config.
fn node() -> &'static NodeSettings {
    static NODE: OnceLock<NodeSettings> = OnceLock::new();
    NODE.get_or_init(|| {
        let config = Config::from_yaml(
            "node: {memoryCapacity: 8Gi, cpuCapacity: \"4\"}\nsystemReserved: {memory: 512Mi}\n",
        )
        .expect("the node's config loads");
        NodePlan::from_config(&config, CgroupVersion::V2, 1 << 30)
            .expect("the node's plan")
            .cgroups
    })
}

fuzz_target!(|data: &[u8]| {
    // A static manifest is marked as such; which one this input is, its first byte says.
    let static_source = data.first().is_some_and(|b| b & 1 == 1);
    for format in [Format::Json, Format::Yaml] {
        let value = match document::parse(data, format) {
            Ok(v) => v,
            Err(e) => {
                one_line("parse", &e.to_string());
                continue;
            }
        };
        let checked = match document::check(value, "process", static_source, || "fuzz-uid".into()) {
            Ok(c) => c,
            Err(e) => {
                one_line("check", &e.to_string());
                continue;
            }
        };
        // What the agent keeps is JSON (the pod checkpoint): read back, it is the same pod.
        let kept = serde_json::to_vec(&checked.document).expect("a document serializes");
        let value = document::parse(&kept, Format::Json).expect("the kept document parses");
        let again = document::check(value, "process", static_source, || "other-uid".into())
            .unwrap_or_else(|e| panic!("the kept document is refused: {e}"));
        assert_eq!(again.document, checked.document);
        assert_eq!(again.info, checked.info);
        assert_eq!(again.grace_period_seconds, checked.grace_period_seconds);
        // What the runtime would be given (`spec_for` in node/apply.rs).
        let pod: k8s::Pod = match serde_json::from_value(checked.document.clone()) {
            Ok(p) => p,
            Err(e) => {
                one_line("v1.Pod", &e.to_string());
                continue;
            }
        };
        if let Err(e) = pod_spec(&pod, &checked.info, node(), &BTreeMap::new()) {
            one_line("pod spec", &e.to_string());
        }
    }
});
