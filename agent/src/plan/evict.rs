//! `reactor plan evict`: the order in which the agent would evict pods for a signal.
//!
//! Input `{"signal", "filesystems", "pods", "summary"}`, output `{"signal", "order"}` with
//! every pod (critical and static ones included: the live agent skips those when it evicts,
//! the plan still shows where they rank).

use serde::{Deserialize, Deserializer, Serialize};

use crate::decide::pod::PodInfo;
use crate::decide::rank::rank;
use crate::decide::signal::{FsLayout, Signal};
use crate::decide::summary::Summary;
use crate::plan::input::{parse, InputError};

/// A signal name in plan input; unknown names are refused with the list of valid ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SignalName(pub Signal);

impl<'de> Deserialize<'de> for SignalName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Signal::parse(&text).map(SignalName).ok_or_else(|| {
            let known: Vec<&str> = Signal::ALL.iter().map(|s| s.name()).collect();
            serde::de::Error::custom(format!(
                "unsupported eviction signal {text:?} (expected one of {})",
                known.join(", ")
            ))
        })
    }
}

/// A filesystem layout name in plan input (`shared`, `imagefs`, `imagefs+containerfs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct LayoutName(pub FsLayout);

impl<'de> Deserialize<'de> for LayoutName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        FsLayout::parse(&text).map(LayoutName).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "unknown filesystem layout {text:?} (expected shared, imagefs or imagefs+containerfs)"
            ))
        })
    }
}

/// The `plan evict` input document.
#[derive(Debug, Deserialize)]
pub struct EvictInput {
    /// The signal to rank for.
    pub signal: SignalName,
    /// The filesystem layout (default `shared`).
    #[serde(default)]
    pub filesystems: Option<LayoutName>,
    /// The pods on the node.
    pub pods: Vec<PodInfo>,
    /// The Summary API document; without it no pod has statistics.
    #[serde(default)]
    pub summary: Option<Summary>,
}

/// The `plan evict` answer.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct EvictPlan {
    /// The signal ranked for.
    pub signal: String,
    /// Every pod as `namespace/name`, first to evict first.
    pub order: Vec<String>,
}

/// Ranks the pods of an input document.
pub fn plan(input: &EvictInput) -> EvictPlan {
    let empty = Summary::default();
    let index = input.summary.as_ref().unwrap_or(&empty).index();
    let layout = input.filesystems.unwrap_or_default().0;
    let order = rank(input.signal.0, layout, &input.pods, &index)
        .into_iter()
        .map(|i| input.pods[i].name.clone())
        .collect();
    EvictPlan {
        signal: input.signal.0.name().to_string(),
        order,
    }
}

/// Runs `plan evict` on raw input bytes.
pub fn run(bytes: &[u8]) -> Result<serde_json::Value, InputError> {
    let input: EvictInput = parse(bytes)?;
    serde_json::to_value(plan(&input)).map_err(|e| InputError::Invalid(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_and_names_pods() {
        let out = run(br#"{"signal": "memory.available", "pods": [
            {"metadata": {"name": "a", "namespace": "x", "uid": "1"}},
            {"metadata": {"name": "b", "uid": "2"}}],
            "summary": {"pods": [{"podRef": {"uid": "1"}, "memory": {"workingSetBytes": 10}}]}}"#)
        .unwrap();
        assert_eq!(
            out,
            serde_json::json!({"signal": "memory.available", "order": ["default/b", "x/a"]})
        );
    }

    #[test]
    fn bad_fields_are_named() {
        let e = run(br#"{"signal": "memory.free", "pods": []}"#)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("signal: unsupported eviction signal"), "{e}");
        let e = run(br#"{"signal": "pid.available", "filesystems": "zfs", "pods": []}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("filesystems: unknown filesystem layout"),
            "{e}"
        );
        let e = run(br#"{"signal": "pid.available", "pods": [],
            "summary": {"pods": [{"process_stats": {"process_count": -1}}]}}"#)
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("summary.pods[0].process_stats.process_count:"),
            "{e}"
        );
    }
}
