//! Static pods: the manifests in `staticPodPath`, read at start and rescanned every
//! [`RESCAN`] (a cheap periodic rescan rather than inotify: a directory of a few manifests
//! costs a `readdir` and a few small reads, and a rescan cannot miss an event the way a
//! watch can when the directory itself is replaced).
//!
//! Each `*.yaml`, `*.yml` or `*.json` file holds one v1.Pod. Its pods get the
//! `kubernetes.io/config.source: file` annotation, which makes them static and so critical
//! (they may preempt, and are never ranked for eviction by the live agent). A manifest's
//! uid is derived from its path and content, as the kubelet derives one from the manifest
//! hash: an edited manifest is a new pod (the old one is stopped, the new one admitted on the
//! next scan). A removed manifest removes its pod.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::document::{self, Format};
use super::PodManager;

/// How often the directory is rescanned.
pub(crate) const RESCAN: Duration = Duration::from_secs(1);

/// Reads every manifest in `dir`: (path, hash of path and content, document). Unreadable or
/// malformed files are logged once per content and skipped.
pub(crate) fn scan(
    dir: &Path,
    warned: &mut std::collections::BTreeSet<(PathBuf, u32)>,
) -> Vec<(PathBuf, u32, serde_json::Value)> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    paths.sort();
    for path in paths {
        let Some(format) = Format::from_path(&path) else {
            continue;
        };
        if path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with('.'))
        {
            continue;
        }
        let bytes = match std::fs::metadata(&path) {
            Ok(m) if m.len() > document::MAX_DOCUMENT_BYTES as u64 => {
                if warned.insert((path.clone(), 0)) {
                    tracing::warn!(manifest = %path.display(), "static pod manifest over the size limit, skipped");
                }
                continue;
            }
            Ok(_) => match std::fs::read(&path) {
                Ok(b) => b,
                Err(_) => continue,
            },
            Err(_) => continue,
        };
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(path.as_os_str().as_encoded_bytes());
        hasher.update(&[0]);
        hasher.update(&bytes);
        let hash = hasher.finalize();
        match document::parse(&bytes, format) {
            Ok(doc) => out.push((path, hash, doc)),
            Err(e) => {
                if warned.insert((path.clone(), hash)) {
                    tracing::warn!(manifest = %path.display(), "static pod manifest refused: {e}");
                }
            }
        }
    }
    out
}

/// Scans `dir` now and then every [`RESCAN`], handing the manifests to the pod manager,
/// until `manager` stops.
pub fn watch(manager: PodManager, dir: PathBuf) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        tracing::info!(dir = %dir.display(), every = ?RESCAN, "watching static pod manifests");
        let mut warned = Default::default();
        loop {
            let d = dir.clone();
            let (manifests, w) = match tokio::task::spawn_blocking(move || {
                let found = scan(&d, &mut warned);
                (found, warned)
            })
            .await
            {
                Ok(r) => r,
                Err(_) => return,
            };
            warned = w;
            manager.sync_static(manifests).await;
            tokio::time::sleep(RESCAN).await;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_reads_manifests_and_skips_the_rest() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(
            tmp.path().join("a.yaml"),
            "metadata: {name: a}\nspec: {containers: []}\n",
        )
        .unwrap();
        std::fs::write(
            tmp.path().join("b.json"),
            "{\"metadata\":{\"name\":\"b\"},\"spec\":{}}",
        )
        .unwrap();
        std::fs::write(tmp.path().join("c.txt"), "ignored").unwrap();
        std::fs::write(tmp.path().join("d.yaml"), "- not a pod").unwrap();
        let mut warned = Default::default();
        let found = scan(tmp.path(), &mut warned);
        let names: Vec<_> = found
            .iter()
            .map(|(p, _, _)| p.file_name().unwrap().to_owned())
            .collect();
        assert_eq!(names, ["a.yaml", "b.json"]);
        assert_eq!(warned.len(), 1);
        // Same content, same hash; edited content, new hash.
        let again = scan(tmp.path(), &mut warned);
        assert_eq!(again[0].1, found[0].1);
        std::fs::write(
            tmp.path().join("a.yaml"),
            "metadata: {name: a2}\nspec: {containers: []}\n",
        )
        .unwrap();
        assert_ne!(scan(tmp.path(), &mut warned)[0].1, found[0].1);
    }
}
