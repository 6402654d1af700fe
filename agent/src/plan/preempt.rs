//! `plan preempt`: would a pod that failed admission get in by preempting others, and whom?

use serde::{Deserialize, Serialize};

use super::input::{parse, InputError, JsonQuantity};
use crate::decide::pod::{clamp_i64, PodInfo};
use crate::decide::preempt::{handle_admission_failure, AdmitFailure};
use crate::decide::resources::CPU;

/// The input document: running pods, the pod being admitted, and why it failed.
#[derive(Deserialize)]
pub struct PreemptInput {
    /// Pods running on the node (the preemption candidates), in the node's order.
    #[serde(default)]
    pub pods: Vec<PodInfo>,
    /// The pod asking to be admitted.
    pub admit: PodInfo,
    /// Why it failed admission.
    #[serde(default)]
    pub failures: Vec<FailureInput>,
}

/// One admission failure as written in the input.
#[derive(Deserialize)]
#[serde(tag = "type", deny_unknown_fields)]
pub enum FailureInput {
    /// A resource shortage; quantities in the resource's own unit (cpu in cores or `m`).
    InsufficientResource {
        /// The resource name.
        resource: String,
        /// What the pod requests.
        requested: JsonQuantity,
        /// What is already in use.
        used: JsonQuantity,
        /// What the node has.
        capacity: JsonQuantity,
    },
    /// Any other failure, reported as given.
    Other {
        /// The reason text.
        reason: String,
    },
}

impl FailureInput {
    fn to_failure(&self) -> AdmitFailure {
        match self {
            FailureInput::InsufficientResource {
                resource,
                requested,
                used,
                capacity,
            } => {
                // The kubelet counts cpu in millicores and everything else in whole units.
                let units = |q: &JsonQuantity| {
                    clamp_i64(if resource == CPU {
                        q.0.milli_value()
                    } else {
                        q.0.value()
                    })
                };
                AdmitFailure::InsufficientResource {
                    resource: resource.clone(),
                    requested: units(requested),
                    used: units(used),
                    capacity: units(capacity),
                }
            }
            FailureInput::Other { reason } => AdmitFailure::Other {
                reason: reason.clone(),
            },
        }
    }
}

/// The answer: `{"admit", "preempt", "reasons", "error"}`.
#[derive(Serialize, Debug, PartialEq, Eq)]
pub struct PreemptAnswer {
    /// Whether the pod is admitted.
    pub admit: bool,
    /// Pods to evict (`namespace/name`), in eviction order.
    pub preempt: Vec<String>,
    /// The admission failures that still stand.
    pub reasons: Vec<String>,
    /// Why no set of pods could make room, when none could.
    pub error: Option<String>,
}

/// Decides a parsed input.
pub fn plan(input: &PreemptInput) -> PreemptAnswer {
    let failures: Vec<AdmitFailure> = input
        .failures
        .iter()
        .map(FailureInput::to_failure)
        .collect();
    let d = handle_admission_failure(&input.admit, &input.pods, &failures);
    PreemptAnswer {
        admit: d.admit,
        preempt: d
            .preempt
            .iter()
            .map(|&i| input.pods[i].name.clone())
            .collect(),
        reasons: d.reasons,
        error: d.error,
    }
}

/// Parses a JSON document and decides it; a malformed document is an [`InputError`].
pub fn run(bytes: &[u8]) -> Result<PreemptAnswer, InputError> {
    let input: PreemptInput = parse(bytes)?;
    Ok(plan(&input))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_failures_count_in_millicores() {
        let doc = br#"{
          "pods": [
            {"metadata": {"name": "big", "namespace": "a"}, "spec": {"containers": [
              {"name": "c", "resources": {"requests": {"cpu": "2"}}}]}},
            {"metadata": {"name": "fit", "namespace": "a"}, "spec": {"containers": [
              {"name": "c", "resources": {"requests": {"cpu": "500m"}}}]}}
          ],
          "admit": {"metadata": {"name": "crit", "namespace": "kube-system"},
                    "spec": {"priority": 2000001000, "containers": []}},
          "failures": [{"type": "InsufficientResource", "resource": "cpu",
                        "requested": "1", "used": "3500m", "capacity": 4}]
        }"#;
        let a = run(doc).unwrap();
        assert_eq!(
            a,
            PreemptAnswer {
                admit: true,
                preempt: vec!["a/fit".into()],
                reasons: vec![],
                error: None
            }
        );
    }

    #[test]
    fn unknown_failure_type_is_an_input_error() {
        let doc = br#"{"admit": {"metadata": {"name": "x"}}, "failures": [{"type": "Bogus"}]}"#;
        let e = run(doc).unwrap_err().to_string();
        assert!(
            e.starts_with("failures[0].type: unknown variant `Bogus`"),
            "{e}"
        );
    }

    #[test]
    fn bad_quantity_in_a_failure_names_it() {
        let doc = br#"{"admit": {"metadata": {"name": "x"}}, "failures": [{"type": "InsufficientResource",
            "resource": "memory", "requested": "12Qi", "used": 0, "capacity": 0}]}"#;
        let e = run(doc).unwrap_err().to_string();
        assert!(e.contains("failures[0]") && e.contains("12Qi"), "{e}");
    }

    #[test]
    fn missing_admit_is_an_input_error() {
        let e = run(br#"{"pods": []}"#).unwrap_err().to_string();
        assert!(e.contains("missing field `admit`"), "{e}");
    }
}
