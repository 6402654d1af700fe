//! Carrying out a plan's deletions against the runtime, one image at a time, in plan order.
//!
//! The kubelet's rule: a refused deletion does not stop the round — the next image may free
//! what this one could not. The exception here is a runtime that is down or hung: every
//! later call would fail the same way (or wait out its timeout), so the round stops there,
//! keeping what it already freed, and is reported as failed.

use std::future::Future;

use crate::act::cri::CriError;
use crate::decide::image_gc::DeleteReason;

/// One planned deletion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deletion {
    /// The image id.
    pub id: String,
    /// Its size as the runtime reported it (what the deletion is counted as freeing).
    pub size_bytes: u64,
    /// Why the plan deletes it.
    pub reason: DeleteReason,
}

/// What happened to a plan's deletions.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Executed {
    /// Deleted, in order.
    pub deleted: Vec<Deletion>,
    /// Already gone when asked (someone else removed it): the record goes, nothing is
    /// counted as freed.
    pub gone: Vec<String>,
    /// Deletions the runtime refused, `"<id>: <error>"`.
    pub errors: Vec<String>,
    /// The runtime went away; deletions after this one were not attempted.
    pub aborted: Option<CriError>,
}

impl Executed {
    /// Bytes freed by the deletions made.
    pub(crate) fn freed_bytes(&self) -> u64 {
        self.deleted.iter().map(|d| d.size_bytes).sum()
    }

    /// Bytes freed by deletions made for space (not for age).
    pub(crate) fn freed_for_space(&self) -> u64 {
        self.deleted
            .iter()
            .filter(|d| d.reason == DeleteReason::Space)
            .map(|d| d.size_bytes)
            .sum()
    }
}

/// Deletes `plan` in order with `remove` (the runtime's `RemoveImage`).
pub(crate) async fn delete_in_order<F, Fut>(plan: Vec<Deletion>, mut remove: F) -> Executed
where
    F: FnMut(String) -> Fut,
    Fut: Future<Output = Result<(), CriError>>,
{
    let mut out = Executed::default();
    for d in plan {
        match remove(d.id.clone()).await {
            Ok(()) => {
                tracing::info!(image = %d.id, size = %crate::human::bytes(i128::from(d.size_bytes)), bytes = d.size_bytes, reason = ?d.reason, "image GC removed image");
                out.deleted.push(d);
            }
            Err(e) if e.is_not_found() => out.gone.push(d.id),
            Err(e) if e.is_runtime_down() => {
                out.aborted = Some(e);
                break;
            }
            Err(e) => {
                tracing::warn!(image = %d.id, error = %e, "image GC could not remove image");
                out.errors.push(format!("{}: {e}", d.id));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(ids: &[&str]) -> Vec<Deletion> {
        ids.iter()
            .enumerate()
            .map(|(i, id)| Deletion {
                id: id.to_string(),
                size_bytes: 10 * (i as u64 + 1),
                reason: if i == 0 {
                    DeleteReason::Age
                } else {
                    DeleteReason::Space
                },
            })
            .collect()
    }

    fn block_on<T>(f: impl Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn a_refused_deletion_does_not_stop_the_round() {
        let mut asked = Vec::new();
        let out = block_on(delete_in_order(plan(&["a", "b", "c", "d"]), |id| {
            asked.push(id.clone());
            async move {
                match id.as_str() {
                    "b" => Err(CriError::Other {
                        rpc: "RemoveImage",
                        code: "Internal".into(),
                        message: "in use".into(),
                    }),
                    "c" => Err(CriError::NotFound {
                        rpc: "RemoveImage",
                        message: "gone".into(),
                    }),
                    _ => Ok(()),
                }
            }
        }));
        assert_eq!(asked, ["a", "b", "c", "d"]);
        let deleted: Vec<&str> = out.deleted.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(deleted, ["a", "d"]);
        assert_eq!(out.gone, ["c"]);
        assert_eq!(out.errors.len(), 1);
        assert!(
            out.errors[0].starts_with("b: RemoveImage: Internal"),
            "{:?}",
            out.errors
        );
        assert_eq!(out.freed_bytes(), 10 + 40);
        assert_eq!(out.freed_for_space(), 40);
        assert!(out.aborted.is_none());
    }

    #[test]
    fn a_runtime_gone_mid_round_stops_it_keeping_what_was_freed() {
        let mut asked = Vec::new();
        let out = block_on(delete_in_order(plan(&["a", "b", "c"]), |id| {
            asked.push(id.clone());
            async move {
                if id == "b" {
                    Err(CriError::Unavailable {
                        rpc: "RemoveImage",
                        message: "connection refused".into(),
                    })
                } else {
                    Ok(())
                }
            }
        }));
        assert_eq!(asked, ["a", "b"]);
        assert_eq!(out.freed_bytes(), 10);
        assert!(out.aborted.unwrap().is_runtime_down());
    }
}
