//! [`CgroupPath`]: a cgroup below the manager's cgroup root, made of checked names, so no
//! path can climb out of the root it is joined onto.

use std::path::{Path, PathBuf};

use super::error::CgroupError;
use crate::decide::cgroups::pod_cgroup;
use crate::decide::pod::PodInfo;

/// The top of the pod tree, below the cgroup root (the kubelet's name with cgroupfs).
const KUBEPODS: &str = "kubepods";

/// A cgroup below the manager's cgroup root, as a list of checked names.
///
/// Names are what the kubelet and runtimes use (`kubepods`, `burstable`, `pod<uid>`, a
/// container name or id): a name may not be empty, `.` or `..`, contain `/` or NUL, or be
/// longer than 255 bytes. That makes joining onto a mount root unable to escape it.
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Default,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(try_from = "String", into = "String")]
pub struct CgroupPath {
    names: Vec<String>,
}

fn check_name(name: &str) -> Result<(), CgroupError> {
    let reason = if name.is_empty() {
        "empty"
    } else if name == "." || name == ".." {
        "a relative step"
    } else if name.contains('/') {
        "contains '/'"
    } else if name.contains('\0') {
        "contains NUL"
    } else if name.len() > 255 {
        "longer than 255 bytes"
    } else {
        return Ok(());
    };
    Err(CgroupError::BadName {
        name: name.to_string(),
        reason,
    })
}

impl CgroupPath {
    /// The cgroup root itself.
    pub fn root() -> CgroupPath {
        CgroupPath::default()
    }

    /// Parses `a/b/c` (a leading `/` and repeated slashes are accepted; `.`/`..` are not).
    pub fn parse(text: &str) -> Result<CgroupPath, CgroupError> {
        let mut path = CgroupPath::root();
        for name in text.split('/').filter(|n| !n.is_empty()) {
            check_name(name).map_err(|_| CgroupError::BadName {
                name: text.to_string(),
                reason: "a component is '.', '..', too long or contains NUL",
            })?;
            path.names.push(name.to_string());
        }
        Ok(path)
    }

    /// This cgroup's child `name`.
    pub fn join(&self, name: &str) -> Result<CgroupPath, CgroupError> {
        check_name(name)?;
        let mut child = self.clone();
        child.names.push(name.to_string());
        Ok(child)
    }

    /// The parent cgroup; `None` for the root.
    #[cfg(test)]
    pub(crate) fn parent(&self) -> Option<CgroupPath> {
        let mut parent = self.clone();
        parent.names.pop().map(|_| parent)
    }

    /// The names from the root down.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// `true` for the cgroup root itself.
    pub(crate) fn is_root(&self) -> bool {
        self.names.is_empty()
    }

    /// Appends this path to a directory.
    pub fn under(&self, dir: &Path) -> PathBuf {
        let mut p = dir.to_path_buf();
        p.extend(&self.names);
        p
    }

    /// `kubepods`: the parent of every pod cgroup.
    pub fn kubepods() -> CgroupPath {
        CgroupPath {
            names: vec![KUBEPODS.to_string()],
        }
    }

    /// `kubepods/<name>`, a QoS tier's cgroup (`burstable`, `besteffort`): fixed names, so
    /// not checked as a caller's would be.
    pub(super) fn qos_tier(name: &'static str) -> CgroupPath {
        CgroupPath {
            names: vec![KUBEPODS.to_string(), name.to_string()],
        }
    }

    /// The pod cgroup `kubepods[/<qos>]/pod<uid>`; `qos_dir` is `None` for Guaranteed pods,
    /// `Some("burstable")`/`Some("besteffort")` otherwise.
    pub fn pod(qos_dir: Option<&str>, uid: &str) -> Result<CgroupPath, CgroupError> {
        let mut p = CgroupPath::kubepods();
        if let Some(q) = qos_dir {
            p = p.join(q)?;
        }
        p.join(&format!("pod{uid}"))
    }
}

impl TryFrom<String> for CgroupPath {
    type Error = CgroupError;
    fn try_from(text: String) -> Result<Self, Self::Error> {
        CgroupPath::parse(&text)
    }
}

impl From<CgroupPath> for String {
    fn from(path: CgroupPath) -> String {
        path.to_string()
    }
}

impl std::fmt::Display for CgroupPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "/{}", self.names.join("/"))
    }
}

impl CgroupPath {
    /// The pod cgroup of a pod as `decide` sees it (`kubepods[/burstable|/besteffort]/pod<uid>`).
    pub fn for_pod(pod: &PodInfo) -> Result<CgroupPath, CgroupError> {
        if pod.uid.is_empty() {
            return Err(CgroupError::BadName {
                name: pod.name.clone(),
                reason: "the pod has no metadata.uid to name its cgroup",
            });
        }
        CgroupPath::parse(&pod_cgroup(pod))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_cannot_escape() {
        for bad in ["..", ".", "", "a/b", "a\0b"] {
            assert!(CgroupPath::root().join(bad).is_err(), "{bad:?}");
        }
        assert!(CgroupPath::parse("kubepods/../etc").is_err());
        let p = CgroupPath::parse("/kubepods//burstable/").unwrap();
        assert_eq!(p.to_string(), "/kubepods/burstable");
        assert_eq!(
            p.under(Path::new("/m")),
            PathBuf::from("/m/kubepods/burstable")
        );
        assert_eq!(
            CgroupPath::pod(Some("besteffort"), "u1")
                .unwrap()
                .to_string(),
            "/kubepods/besteffort/podu1"
        );
        assert_eq!(
            CgroupPath::pod(None, "u1").unwrap().parent(),
            Some(CgroupPath::kubepods())
        );
    }

    #[test]
    fn pod_cgroup_from_the_pod_model() {
        let pod = crate::decide::pod::PodInfo::from_json(serde_json::json!({
            "metadata": {"name": "web", "uid": "u-1"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}
        }))
        .unwrap();
        assert_eq!(
            CgroupPath::for_pod(&pod).unwrap().to_string(),
            "/kubepods/burstable/podu-1"
        );
    }
}
