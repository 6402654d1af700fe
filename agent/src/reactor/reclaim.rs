//! Node-level reclaim before any eviction, as the kubelet's eviction manager does it.
//!
//! For disk signals the kubelet first frees what no running pod needs — exited containers
//! (and not-ready sandboxes), then unused images — and evicts only if that was not enough.
//! For memory and pids there is nothing node-level to reclaim. Which filesystems those steps
//! free depends on the layout (seed 003): dead containers live on the filesystem that holds
//! writable layers and logs, images on imagefs.

use std::future::Future;
use std::pin::Pin;

use crate::decide::signal::Signal;
use crate::images::ImageGcManager;

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

/// The boxed future a [`NodeReclaim`] returns (object safe, so the loop holds any).
pub type ReclaimFuture<'a> =
    Pin<Box<dyn Future<Output = Result<NodeReclaimed, String>> + Send + 'a>>;

/// Frees node-level disk resources: dead containers, then unused images.
pub trait NodeReclaim: Send + Sync {
    /// Removes dead containers and deletes unused images (the kubelet's
    /// `DeleteAllUnusedContainers` + `DeleteUnusedImages`).
    fn reclaim(&self) -> ReclaimFuture<'_>;
}

impl NodeReclaim for ImageGcManager {
    fn reclaim(&self) -> ReclaimFuture<'_> {
        Box::pin(async move {
            let r = self
                .delete_unused_images()
                .await
                .map_err(|e| e.to_string())?;
            Ok(NodeReclaimed {
                freed_bytes: r.freed_bytes,
                containers_removed: r.containers_removed.len() + r.sandboxes_removed.len(),
                images_deleted: r.deleted.len(),
            })
        })
    }
}

/// Whether a threshold on `signal` is worth a node-level reclaim: under every layout each
/// disk signal is (dead containers free writable layers and logs on nodefs/containerfs,
/// unused images free imagefs, and with one shared filesystem both free it, so the one
/// combined step serves every layout); memory and pids are not.
pub fn reclaims_node_level(signal: Signal) -> bool {
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
