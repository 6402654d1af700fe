//! Node-level reclaim before any eviction, as the kubelet's eviction manager does it.
//!
//! For disk signals the kubelet first frees what no running pod needs — exited containers
//! (and not-ready sandboxes), then unused images — and evicts only if that was not enough.
//! For memory and pids there is nothing node-level to reclaim. Which filesystems those steps
//! free depends on the layout (seed 003): dead containers live on the filesystem that holds
//! writable layers and logs, images on imagefs; [`reclaim_steps`] takes only the steps that
//! can relieve the filesystem under pressure.

use std::future::Future;
use std::pin::Pin;

use crate::decide::signal::{FsLayout, Signal};
use crate::images::{ImageGcError, ImageGcManager};

/// What a node-level reclaim freed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeReclaimed {
    /// Bytes freed, as the runtime reported the deleted images' sizes.
    pub freed_bytes: u64,
    /// Containers and sandboxes removed.
    pub containers_removed: usize,
    /// Images deleted.
    pub images_deleted: usize,
}

/// Why a node-level reclaim failed. The loop records it in its decision and evicts anyway.
#[derive(Debug, thiserror::Error)]
pub enum ReclaimError {
    /// The image garbage collector could not remove dead containers or delete images.
    #[error(transparent)]
    ImageGc(#[from] ImageGcError),
}

/// The boxed future a [`NodeReclaim`] returns (object safe, so the loop holds any).
pub(crate) type ReclaimFuture<'a> =
    Pin<Box<dyn Future<Output = Result<NodeReclaimed, ReclaimError>> + Send + 'a>>;

/// Which node-level steps can free the filesystem a disk signal measures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReclaimSteps {
    /// Remove exited containers and not-ready sandboxes (writable layers, logs).
    pub dead_containers: bool,
    /// Delete unused images.
    pub unused_images: bool,
}

impl ReclaimSteps {
    /// Whether there is any step to take.
    pub(crate) fn any(self) -> bool {
        self.dead_containers || self.unused_images
    }
}

/// The steps seed 003 lists for a signal under a layout: with one filesystem both; with a
/// separate image filesystem, dead containers for `nodefs` and, for `imagefs` (and
/// `containerfs`, the same filesystem there), dead containers — whose writable layers live
/// on it — then unused images; with a split image filesystem, dead containers for
/// `containerfs` (and `nodefs`, the same filesystem) and unused images for `imagefs`.
/// Nothing for memory and pids. Deleting images on pressure they cannot relieve would only
/// make pods pull them again.
pub(crate) fn reclaim_steps(signal: Signal, layout: FsLayout) -> ReclaimSteps {
    const BOTH: ReclaimSteps = ReclaimSteps {
        dead_containers: true,
        unused_images: true,
    };
    const CONTAINERS: ReclaimSteps = ReclaimSteps {
        dead_containers: true,
        unused_images: false,
    };
    const IMAGES: ReclaimSteps = ReclaimSteps {
        dead_containers: false,
        unused_images: true,
    };
    if !reclaims_node_level(signal) {
        return ReclaimSteps::default();
    }
    let imagefs = matches!(signal, Signal::ImageFsAvailable | Signal::ImageFsInodesFree);
    let nodefs = matches!(signal, Signal::NodeFsAvailable | Signal::NodeFsInodesFree);
    match layout {
        FsLayout::Shared => BOTH,
        FsLayout::ImageFs if nodefs => CONTAINERS,
        FsLayout::ImageFs => BOTH,
        FsLayout::ImageFsContainerFs if imagefs => IMAGES,
        FsLayout::ImageFsContainerFs => CONTAINERS,
    }
}

/// Frees node-level disk resources: dead containers, then unused images.
pub trait NodeReclaim: Send + Sync {
    /// Removes dead containers and deletes unused images (the kubelet's
    /// `DeleteAllUnusedContainers` + `DeleteUnusedImages`).
    fn reclaim(&self) -> ReclaimFuture<'_>;

    /// Takes only `steps` ([`reclaim_steps`]). The default serves a reclaimer that cannot
    /// take them apart: everything [`NodeReclaim::reclaim`] does when unused images are
    /// asked for, nothing otherwise.
    fn reclaim_steps(&self, steps: ReclaimSteps) -> ReclaimFuture<'_> {
        if steps.unused_images {
            self.reclaim()
        } else {
            Box::pin(std::future::ready(Ok(NodeReclaimed::default())))
        }
    }
}

impl NodeReclaim for ImageGcManager {
    fn reclaim(&self) -> ReclaimFuture<'_> {
        self.reclaim_steps(ReclaimSteps {
            dead_containers: true,
            unused_images: true,
        })
    }

    fn reclaim_steps(&self, steps: ReclaimSteps) -> ReclaimFuture<'_> {
        Box::pin(async move {
            // Deleting unused images removes the dead containers first (their images are
            // then unused too).
            let r = if steps.unused_images {
                self.delete_unused_images().await
            } else if steps.dead_containers {
                self.delete_dead_containers().await
            } else {
                return Ok(NodeReclaimed::default());
            }?;
            Ok(NodeReclaimed {
                freed_bytes: r.freed_bytes,
                containers_removed: r.containers_removed.len() + r.sandboxes_removed.len(),
                images_deleted: r.deleted.len(),
            })
        })
    }
}

/// Whether a threshold on `signal` may be relieved by a node-level reclaim: every disk
/// signal under every layout (which steps, [`reclaim_steps`] says); memory and pids not.
pub(crate) fn reclaims_node_level(signal: Signal) -> bool {
    matches!(
        signal,
        Signal::NodeFsAvailable
            | Signal::NodeFsInodesFree
            | Signal::ImageFsAvailable
            | Signal::ImageFsInodesFree
            | Signal::ContainerFsAvailable
            | Signal::ContainerFsInodesFree
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_follow_the_layout_as_seed_003_lists_them() {
        let both = ReclaimSteps {
            dead_containers: true,
            unused_images: true,
        };
        let containers = ReclaimSteps {
            dead_containers: true,
            unused_images: false,
        };
        let images = ReclaimSteps {
            dead_containers: false,
            unused_images: true,
        };
        for s in [
            Signal::NodeFsAvailable,
            Signal::ImageFsInodesFree,
            Signal::ContainerFsAvailable,
        ] {
            assert_eq!(reclaim_steps(s, FsLayout::Shared), both, "{s}");
        }
        assert_eq!(
            reclaim_steps(Signal::NodeFsInodesFree, FsLayout::ImageFs),
            containers
        );
        assert_eq!(
            reclaim_steps(Signal::ImageFsAvailable, FsLayout::ImageFs),
            both
        );
        assert_eq!(
            reclaim_steps(Signal::ContainerFsAvailable, FsLayout::ImageFs),
            both
        );
        assert_eq!(
            reclaim_steps(Signal::ImageFsAvailable, FsLayout::ImageFsContainerFs),
            images
        );
        for s in [Signal::ContainerFsInodesFree, Signal::NodeFsAvailable] {
            assert_eq!(
                reclaim_steps(s, FsLayout::ImageFsContainerFs),
                containers,
                "{s}"
            );
        }
        for s in [
            Signal::MemoryAvailable,
            Signal::AllocatableMemoryAvailable,
            Signal::PidAvailable,
        ] {
            assert!(!reclaim_steps(s, FsLayout::Shared).any(), "{s}");
        }
    }
}
