//! The image GC manager: the kubelet's `realImageGCManager` over CRI, with its records
//! checkpointed.
//!
//! One manager per runtime. It detects images (records: first detected, last used, size,
//! pinned), runs periodic GC rounds — above `imageGCHighThresholdPercent`, unused images go
//! least recently used first until usage is at `imageGCLowThresholdPercent`; unused images
//! older than `imageMaximumGCAge` go whatever the usage — and offers
//! [`delete_unused_images`](ImageGcManager::delete_unused_images) to the disk-pressure
//! reclaim. What to delete is decided by [`crate::decide::image_gc`] with time passed in;
//! this module only observes the runtime, carries the plan out and reports.
//!
//! Rounds are serialized (a reclaim waits for a periodic round in progress and then sees its
//! result). Every outcome goes out as an [`ImageGcEvent`] on a broadcast channel and into the
//! [`Counters`]; the manager never stops on a failed round: the next period tries again.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::broadcast;

use crate::act::cri::{ContainerFilter, ContainerState, CriClient, CriError, ImageInfo};
use crate::decide::image_gc::{self, ImageFs};
use crate::decide::timestamp::UnixNanos;
use crate::human;
use crate::record::checkpoint::Checkpoint;
use crate::record::state_file::Notices;

use super::containers::remove_dead_containers;
use super::delete::{delete_in_order, Deletion, Executed};
use super::events::{Counter, Counters, CountersSnapshot, GcTrigger, ImageGcEvent};
use super::records::{images_in_use, ImageRecords, StoredRecords};
pub use super::settings::{ImageGcError, ImageGcSettings};

/// The checkpoint file under `stateDir`.
pub const CHECKPOINT_FILE: &str = "image-records.json";
/// The checkpoint's kind tag (public, with the version, for the fuzz targets in `fuzz/`).
pub const CHECKPOINT_KIND: &str = "image-records";
/// The checkpoint's format version.
pub const CHECKPOINT_VERSION: u32 = 1;

/// The outcome of a periodic GC round that ran to its end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GcRound {
    /// Usage of the image filesystem (percent) the round planned with.
    pub usage_percent: Option<i64>,
    /// What it had to free to reach the low threshold; `None` below the high threshold.
    pub bytes_to_free: Option<i64>,
    /// Images deleted, in order, with their sizes and reasons.
    pub deleted: Vec<Deletion>,
    /// Sum of the deleted images' sizes as the runtime listed them.
    pub freed_bytes: u64,
    /// Deletions the runtime refused.
    pub errors: Vec<String>,
    /// The `FreeDiskSpaceFailed` message when the round freed less than it needed.
    pub shortfall: Option<String>,
}

impl GcRound {
    /// The round's failure as the kubelet would report it from `GarbageCollect`, if any.
    pub(crate) fn failure(&self) -> Option<String> {
        self.shortfall.clone().or_else(|| {
            (!self.errors.is_empty())
                .then(|| format!("errors in image deletion: [{}]", self.errors.join(", ")))
        })
    }
}

/// The outcome of a disk-pressure reclaim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reclaimed {
    /// Exited containers removed first.
    pub containers_removed: Vec<String>,
    /// Not-ready sandboxes removed first.
    pub sandboxes_removed: Vec<String>,
    /// Images deleted, in order.
    pub deleted: Vec<Deletion>,
    /// Sum of the deleted images' sizes as the runtime listed them.
    pub freed_bytes: u64,
    /// Removals the runtime refused (containers, sandboxes, images).
    pub errors: Vec<String>,
}

/// What a detection saw.
struct Observed {
    images: Vec<ImageInfo>,
    in_use: BTreeSet<String>,
}

struct State {
    records: ImageRecords,
    /// Whether a detection has run since the records began (from a checkpoint counts): the
    /// first detection without history dates new images to "unknown past", as the kubelet's.
    initialized: bool,
}

struct Inner {
    client: CriClient,
    settings: ImageGcSettings,
    state: tokio::sync::Mutex<State>,
    cache: Mutex<Option<Vec<ImageInfo>>>,
    events: broadcast::Sender<ImageGcEvent>,
    counters: Counters,
    previous_failed: AtomicBool,
    started_at: UnixNanos,
    checkpoint: Option<Checkpoint>,
}

/// The image GC manager. Cheap to clone; clones share one state.
#[derive(Clone)]
pub struct ImageGcManager {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ImageGcManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageGcManager")
            .field("settings", &self.inner.settings)
            .finish_non_exhaustive()
    }
}

/// Wall-clock now as Unix nanoseconds: the one clock read of image GC, handed to the pure
/// bookkeeping and plan.
fn now_nanos() -> UnixNanos {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => UnixNanos::try_from(d.as_nanos()).unwrap_or(UnixNanos::MAX),
        Err(e) => -UnixNanos::try_from(e.duration().as_nanos()).unwrap_or(UnixNanos::MAX),
    }
}

impl ImageGcManager {
    /// Validates the settings (the kubelet's policy checks) and loads the records checkpoint
    /// from `state_dir` (creating the directory). A damaged checkpoint is set aside by the
    /// checkpoint layer and the manager starts without history, saying so in the log.
    /// Nothing is asked of the runtime yet.
    pub fn new(
        client: CriClient,
        settings: ImageGcSettings,
    ) -> Result<ImageGcManager, ImageGcError> {
        Self::with_notices(client, settings, Notices::default())
    }

    /// [`Self::new`], sending what happens to the records file (set aside, failed writes)
    /// to `notices`.
    pub fn with_notices(
        client: CriClient,
        settings: ImageGcSettings,
        notices: Notices,
    ) -> Result<ImageGcManager, ImageGcError> {
        settings.validate()?;
        let mut records = ImageRecords::new();
        let mut initialized = false;
        let checkpoint = match &settings.state_dir {
            None => None,
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(|source| ImageGcError::StateDir {
                    path: dir.clone(),
                    source,
                })?;
                let cp = Checkpoint::new(
                    dir.join(CHECKPOINT_FILE),
                    CHECKPOINT_KIND,
                    CHECKPOINT_VERSION,
                )
                .with_notices(notices);
                // A damaged file was set aside and noticed by the checkpoint layer; the
                // previous generation, or no history, is used.
                if let Some(stored) = cp.load::<StoredRecords>().value {
                    records = ImageRecords::from_stored(stored);
                    initialized = true;
                    tracing::info!(images = records.len(), path = %cp.path().display(), "image GC records restored");
                }
                Some(cp)
            }
        };
        let (events, _) = broadcast::channel(256);
        Ok(ImageGcManager {
            inner: Arc::new(Inner {
                client,
                settings,
                state: tokio::sync::Mutex::new(State {
                    records,
                    initialized,
                }),
                cache: Mutex::new(None),
                events,
                counters: Counters::default(),
                previous_failed: AtomicBool::new(false),
                started_at: now_nanos(),
                checkpoint,
            }),
        })
    }

    /// The settings the manager runs with.
    pub fn settings(&self) -> &ImageGcSettings {
        &self.inner.settings
    }

    /// A receiver of every event from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<ImageGcEvent> {
        self.inner.events.subscribe()
    }

    /// The counters now.
    pub fn counters(&self) -> CountersSnapshot {
        self.inner.counters.snapshot()
    }

    /// A copy of the records.
    pub async fn records(&self) -> ImageRecords {
        self.inner.state.lock().await.records.clone()
    }

    /// The cached image list (the kubelet's `GetImageList`): as of the last refresh or
    /// detection, `None` before the first.
    pub fn image_list(&self) -> Option<Vec<ImageInfo>> {
        self.inner
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Lists images from the runtime into the cache; returns how many there are.
    pub(crate) async fn refresh_image_list(&self) -> Result<usize, ImageGcError> {
        let images = self.inner.client.list_images().await?;
        let n = images.len();
        self.set_cache(images);
        Ok(n)
    }

    fn set_cache(&self, images: Vec<ImageInfo>) {
        *self.inner.cache.lock().unwrap_or_else(|e| e.into_inner()) = Some(images);
    }

    fn emit(&self, event: ImageGcEvent) {
        match &event {
            ImageGcEvent::RoundFinished {
                trigger,
                freed_bytes,
                deleted,
                errors,
                dry_run,
                ..
            } => {
                if errors.is_empty() {
                    tracing::info!(
                        ?trigger,
                        dry_run,
                        freed = %human::bytes(i128::from(*freed_bytes)),
                        freed_bytes,
                        deleted = deleted.len(),
                        "image GC round finished"
                    )
                } else {
                    tracing::warn!(?trigger, freed = %human::bytes(i128::from(*freed_bytes)), freed_bytes, deleted = deleted.len(), errors = ?errors, "image GC round finished with deletion errors")
                }
            }
            ImageGcEvent::FreeDiskSpaceFailed { message } => {
                tracing::warn!(reason = "FreeDiskSpaceFailed", "{message}")
            }
            ImageGcEvent::ImageGcFailed { message } => tracing::error!(
                reason = "ImageGCFailed",
                "Image garbage collection failed multiple times in a row: {message}"
            ),
            ImageGcEvent::RoundFailed { trigger, reason } => {
                tracing::warn!(?trigger, "image GC round failed: {reason}")
            }
        }
        // No receiver is fine: the agent may not forward events yet.
        let _ = self.inner.events.send(event);
    }

    /// What the runtime holds and uses: images, the ids running containers use, and the
    /// sandbox image (containerd 1.6 never sets `pinned`, so it is resolved from the
    /// runtime's status to an id here). Images are listed before containers, as the kubelet
    /// does, so an image a container starts using in between is not missed as "in use" for
    /// an image that is already recorded.
    async fn observe(&self) -> Result<Observed, CriError> {
        let client = &self.inner.client;
        let sandbox_ref = match &self.inner.settings.sandbox_image {
            Some(s) => Some(s.clone()),
            None => client.status().await?.sandbox_image,
        };
        let sandbox_id = match sandbox_ref {
            Some(r) => client.image_status(&r).await?.map(|i| i.id),
            None => None,
        };
        let images = client.list_images().await?;
        let running = client
            .list_containers(&ContainerFilter {
                state: Some(ContainerState::Running),
                ..Default::default()
            })
            .await?;
        let refs = running.iter().map(|c| {
            if c.image_ref.is_empty() {
                c.image.as_str()
            } else {
                c.image_ref.as_str()
            }
        });
        let in_use = images_in_use(&images, refs, sandbox_id.as_deref());
        self.set_cache(images.clone());
        Ok(Observed { images, in_use })
    }

    /// Updates the records from an observation made at `now`.
    fn detect_locked(&self, state: &mut State, seen: &Observed, now: UnixNanos) -> bool {
        let detected_at = state.initialized.then_some(now);
        let out = state
            .records
            .detect(&seen.images, &seen.in_use, detected_at, now);
        state.initialized = true;
        self.inner.counters.add(Counter::Detections, 1);
        if !out.added.is_empty() || !out.removed.is_empty() {
            tracing::debug!(added = ?out.added, removed = ?out.removed, "image GC detection");
        }
        out.changed
    }

    /// Writes the records checkpoint (off the async workers: it fsyncs). A failure is
    /// logged, not fatal: GC works on, only the history a restart would keep is older.
    async fn save(&self, records: &ImageRecords) {
        let Some(cp) = self.inner.checkpoint.clone() else {
            return;
        };
        let stored = records.to_stored();
        let result = tokio::task::spawn_blocking(move || cp.save(&stored)).await;
        match result {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "image GC records not saved"),
            Err(e) => tracing::warn!(error = %e, "image GC records not saved"),
        }
    }

    /// The kubelet's `detectImages`: refreshes the records; returns the ids in use.
    pub async fn detect_images(&self) -> Result<BTreeSet<String>, ImageGcError> {
        let mut state = self.inner.state.lock().await;
        let now = now_nanos();
        let seen = self.observe().await?;
        // A checkpoint whose last write failed (a full disk) is written again on every
        // detection until it succeeds, changed or not.
        let failing = self
            .inner
            .checkpoint
            .as_ref()
            .is_some_and(Checkpoint::is_failing);
        if self.detect_locked(&mut state, &seen, now) || failing {
            self.save(&state.records).await;
        }
        Ok(seen.in_use)
    }

    /// Measures the image filesystem: the configured path by statvfs, else the runtime's
    /// first image filesystem (`ImageFsInfo`, capacity by statvfs on its mount point).
    async fn image_fs(&self) -> Result<ImageFs, ImageGcError> {
        let bytes = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        if let Some(path) = &self.inner.settings.imagefs_path {
            let st = rustix::fs::statvfs(path)
                .map_err(|e| ImageGcError::ImageFs(format!("statvfs {}: {e}", path.display())))?;
            return Ok(ImageFs {
                capacity_bytes: bytes(st.f_blocks.saturating_mul(st.f_frsize)),
                available_bytes: bytes(st.f_bavail.saturating_mul(st.f_frsize)),
            });
        }
        let info = self.inner.client.image_fs_info().await?;
        let fs = info.image_filesystems.first().ok_or_else(|| {
            ImageGcError::ImageFs("the runtime reported no image filesystem".into())
        })?;
        match (fs.capacity_bytes, fs.available_bytes) {
            (Some(c), Some(a)) => Ok(ImageFs {
                capacity_bytes: bytes(c),
                available_bytes: bytes(a),
            }),
            _ => Err(ImageGcError::ImageFs(format!(
                "cannot measure {} (not visible from the agent); set node.imagefsPath",
                fs.mount_point.display()
            ))),
        }
    }

    /// Carries out `deletions`, drops the records of deleted images, saves, counts.
    /// Deletes the images a plan chose (indices into `input`), in its order; a round the
    /// runtime interrupted is an error that says how far it got.
    async fn delete_planned(
        &self,
        state: &mut State,
        input: &[image_gc::ImageRecord],
        delete: &[(usize, image_gc::DeleteReason)],
        changed: bool,
    ) -> Result<Executed, ImageGcError> {
        let deletions = delete
            .iter()
            .filter_map(|&(i, reason)| {
                let image = input.get(i)?;
                Some(Deletion {
                    id: image.id.clone(),
                    size_bytes: u64::try_from(image.size_bytes).unwrap_or(0),
                    reason,
                })
            })
            .collect();
        let mut executed = self.execute(state, deletions, changed).await;
        if let Some(source) = executed.aborted.take() {
            return Err(ImageGcError::Interrupted {
                source,
                deleted: executed.deleted.len(),
                freed_bytes: executed.freed_bytes(),
            });
        }
        Ok(executed)
    }

    async fn execute(
        &self,
        state: &mut State,
        deletions: Vec<Deletion>,
        changed: bool,
    ) -> Executed {
        // A dry run deletes nothing: what it would have deleted is said, and the records
        // keep every image.
        if self.inner.settings.dry_run {
            for d in &deletions {
                tracing::info!(image = %d.id, size = %human::bytes(i128::from(d.size_bytes)), bytes = d.size_bytes, reason = ?d.reason, "dry run: image GC would remove image");
            }
            if changed {
                self.save(&state.records).await;
            }
            return Executed {
                deleted: deletions,
                ..Executed::default()
            };
        }
        let client = self.inner.client.clone();
        let executed = delete_in_order(deletions, |id| {
            let client = client.clone();
            async move { client.remove_image(&id).await }
        })
        .await;
        for id in executed
            .deleted
            .iter()
            .map(|d| &d.id)
            .chain(executed.gone.iter())
        {
            state.records.remove(id);
        }
        if changed || !executed.deleted.is_empty() || !executed.gone.is_empty() {
            self.save(&state.records).await;
        }
        let c = &self.inner.counters;
        c.add(Counter::FreedBytes, executed.freed_bytes());
        c.add(Counter::ImagesDeleted, executed.deleted.len() as u64);
        c.add(Counter::DeletionErrors, executed.errors.len() as u64);
        executed
    }

    /// One periodic GC round (the kubelet's `GarbageCollect`), emitting its events:
    /// `RoundFinished` (and `FreeDiskSpaceFailed` when it freed less than needed) or
    /// `RoundFailed`; `ImageGCFailed` when this is the second failure in a row. Runs
    /// whatever the high threshold; the periodic loop is what a threshold of 100 turns off.
    pub async fn garbage_collect(&self) -> Result<GcRound, ImageGcError> {
        self.inner.counters.add(Counter::Runs, 1);
        let result = self.gc_round().await;
        let failure = match &result {
            Ok(round) => {
                self.emit(ImageGcEvent::RoundFinished {
                    trigger: GcTrigger::Periodic,
                    usage_percent: round.usage_percent,
                    bytes_to_free: round.bytes_to_free,
                    freed_bytes: round.freed_bytes,
                    deleted: round.deleted.iter().map(|d| d.id.clone()).collect(),
                    errors: round.errors.clone(),
                    dry_run: self.inner.settings.dry_run,
                });
                if let Some(message) = &round.shortfall {
                    self.emit(ImageGcEvent::FreeDiskSpaceFailed {
                        message: message.clone(),
                    });
                }
                round.failure()
            }
            Err(e) => {
                self.emit(ImageGcEvent::RoundFailed {
                    trigger: GcTrigger::Periodic,
                    reason: e.to_string(),
                });
                Some(e.to_string())
            }
        };
        match failure {
            Some(message) => {
                self.inner.counters.add(Counter::Failures, 1);
                if self.inner.previous_failed.swap(true, Ordering::Relaxed) {
                    self.emit(ImageGcEvent::ImageGcFailed { message });
                } else {
                    tracing::warn!("Image garbage collection failed once. Stats initialization may not have completed yet: {message}");
                }
            }
            None => {
                if self.inner.previous_failed.swap(false, Ordering::Relaxed) {
                    tracing::info!("Image garbage collection succeeded after failing");
                }
            }
        }
        result
    }

    async fn gc_round(&self) -> Result<GcRound, ImageGcError> {
        let mut state = self.inner.state.lock().await;
        let now = now_nanos();
        let seen = self.observe().await?;
        let changed = self.detect_locked(&mut state, &seen, now);
        let fs = match self.image_fs().await {
            Ok(fs) => fs,
            Err(e) => {
                if changed {
                    self.save(&state.records).await;
                }
                return Err(e);
            }
        };
        let input = state.records.plan_input(&seen.in_use);
        let policy = self.inner.settings.policy;
        let plan = image_gc::plan(&policy, fs, &input, now, Some(self.inner.started_at));
        if plan.usage_percent.is_none() {
            if changed {
                self.save(&state.records).await;
            }
            return Err(ImageGcError::ImageFs(plan.error.unwrap_or_else(|| {
                "invalid capacity 0 on image filesystem".into()
            })));
        }
        if let (Some(usage), Some(amount)) = (plan.usage_percent, plan.bytes_to_free) {
            tracing::info!(
                "Disk usage on image filesystem is at {usage}% which is over the high threshold ({}%). Trying to free {amount} bytes down to the low threshold ({}%).",
                policy.high_threshold_percent,
                policy.low_threshold_percent
            );
        }
        let executed = self
            .delete_planned(&mut state, &input, &plan.delete, changed)
            .await?;
        let freed_bytes = executed.freed_bytes();
        let shortfall = plan.bytes_to_free.and_then(|need| {
            let freed = executed.freed_for_space();
            if i128::from(freed) >= i128::from(need) {
                None
            } else if executed.errors.is_empty() {
                Some(format!(
                    "Failed to garbage collect required amount of images. Attempted to free {need} bytes, but only found {freed} bytes eligible to free."
                ))
            } else {
                Some(format!(
                    "wanted to free {need} bytes, but freed {freed} bytes space with errors in image deletion: [{}]",
                    executed.errors.join(", ")
                ))
            }
        });
        Ok(GcRound {
            usage_percent: plan.usage_percent,
            bytes_to_free: plan.bytes_to_free,
            deleted: executed.deleted,
            freed_bytes,
            errors: executed.errors,
            shortfall,
        })
    }

    /// The disk-pressure reclaim (the kubelet's container GC `DeleteAllUnusedContainers`
    /// followed by `DeleteUnusedImages`): removes exited containers and not-ready
    /// sandboxes, then deletes every unused image image GC may delete — least recently used
    /// first, whatever the thresholds (a high threshold of 100 does not turn this off), still
    /// sparing images in use, the sandbox image, pinned images and images younger than
    /// `imageMinimumGCAge`. Emits `RoundFinished` or `RoundFailed` with the reclaim trigger.
    /// Returns what was freed (the sum of the deleted images' sizes).
    pub async fn delete_unused_images(&self) -> Result<Reclaimed, ImageGcError> {
        self.inner.counters.add(Counter::Reclaims, 1);
        let result = self.reclaim().await;
        match &result {
            Ok(r) => self.emit(ImageGcEvent::RoundFinished {
                trigger: GcTrigger::Reclaim,
                usage_percent: None,
                bytes_to_free: None,
                freed_bytes: r.freed_bytes,
                deleted: r.deleted.iter().map(|d| d.id.clone()).collect(),
                errors: r.errors.clone(),
                dry_run: self.inner.settings.dry_run,
            }),
            Err(e) => self.emit(ImageGcEvent::RoundFailed {
                trigger: GcTrigger::Reclaim,
                reason: e.to_string(),
            }),
        }
        result
    }

    /// The dead-container step alone (the kubelet's `DeleteAllUnusedContainers`), for disk
    /// pressure on a filesystem that holds writable layers and logs but no images (seed 003):
    /// exited containers and not-ready sandboxes are removed, no image is touched.
    pub(crate) async fn delete_dead_containers(&self) -> Result<Reclaimed, ImageGcError> {
        let dead = remove_dead_containers(&self.inner.client, self.inner.settings.dry_run).await?;
        self.count_dead(&dead);
        Ok(Reclaimed {
            containers_removed: dead.containers,
            sandboxes_removed: dead.sandboxes,
            deleted: Vec::new(),
            freed_bytes: 0,
            errors: dead.errors,
        })
    }

    /// Counts the dead containers and sandboxes removed (none in a dry run, which lists
    /// them only).
    fn count_dead(&self, dead: &super::containers::DeadRemoved) {
        if self.inner.settings.dry_run {
            tracing::info!(containers = ?dead.containers, sandboxes = ?dead.sandboxes, "dry run: dead containers and sandboxes not removed");
            return;
        }
        let c = &self.inner.counters;
        c.add(Counter::ContainersRemoved, dead.containers.len() as u64);
        c.add(Counter::SandboxesRemoved, dead.sandboxes.len() as u64);
    }

    async fn reclaim(&self) -> Result<Reclaimed, ImageGcError> {
        let dead = remove_dead_containers(&self.inner.client, self.inner.settings.dry_run).await?;
        self.count_dead(&dead);
        let mut state = self.inner.state.lock().await;
        let now = now_nanos();
        let seen = self.observe().await?;
        let changed = self.detect_locked(&mut state, &seen, now);
        let input = state.records.plan_input(&seen.in_use);
        let plan = image_gc::plan_reclaim(&self.inner.settings.policy, &input, now);
        let executed = self
            .delete_planned(&mut state, &input, &plan.delete, changed)
            .await?;
        let freed_bytes = executed.freed_bytes();
        let mut errors = dead.errors;
        errors.extend(executed.errors);
        Ok(Reclaimed {
            containers_removed: dead.containers,
            sandboxes_removed: dead.sandboxes,
            deleted: executed.deleted,
            freed_bytes,
            errors,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::act::cri::Timeouts;
    use crate::decide::image_gc::ImageGcPolicy;
    use std::path::PathBuf;
    use std::time::Duration;

    fn settings(dir: Option<PathBuf>) -> ImageGcSettings {
        ImageGcSettings {
            policy: ImageGcPolicy {
                high_threshold_percent: 85,
                low_threshold_percent: 80,
                min_age_nanos: 120_000_000_000,
                max_age_nanos: 0,
            },
            period: Duration::from_secs(300),
            list_refresh: Duration::from_secs(30),
            state_dir: dir,
            sandbox_image: None,
            imagefs_path: None,
            dry_run: false,
        }
    }

    async fn client() -> CriClient {
        CriClient::connect("unix:///nonexistent/reactor-test.sock", Timeouts::default())
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn bad_policy_is_refused_with_the_kubelet_message() {
        let mut s = settings(None);
        s.policy.low_threshold_percent = 90;
        let e = ImageGcManager::new(client().await, s).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid image GC policy: LowThresholdPercent 90 can not be higher than HighThresholdPercent 85"
        );
        let mut s = settings(None);
        s.policy.high_threshold_percent = 101;
        let e = ImageGcManager::new(client().await, s).unwrap_err();
        assert!(e.to_string().contains("HighThresholdPercent 101"), "{e}");
        let mut s = settings(None);
        s.period = Duration::ZERO;
        let e = ImageGcManager::new(client().await, s).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid image GC setting imageGC.period: must be greater than zero"
        );
    }

    #[tokio::test]
    async fn a_damaged_checkpoint_is_set_aside_and_the_manager_starts_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(CHECKPOINT_FILE);
        std::fs::write(&path, b"{\"kind\":\"image-records\",\"vers").unwrap();
        let m = ImageGcManager::new(client().await, settings(Some(dir.path().into()))).unwrap();
        assert!(m.records().await.is_empty());
        assert!(!path.exists());
        let kept = std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with("image-records.json.corrupt-")
            })
            .count();
        assert_eq!(kept, 1);
    }

    #[tokio::test]
    async fn a_runtime_that_is_down_fails_the_round_with_an_event() {
        let m = ImageGcManager::new(client().await, settings(None)).unwrap();
        let mut events = m.subscribe();
        let e = m.garbage_collect().await.unwrap_err();
        assert!(e.is_runtime_down(), "{e}");
        match events.recv().await.unwrap() {
            ImageGcEvent::RoundFailed { trigger, reason } => {
                assert_eq!(trigger, GcTrigger::Periodic);
                assert!(reason.contains("unavailable"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        // The second failure in a row is the kubelet's ImageGCFailed.
        m.garbage_collect().await.unwrap_err();
        assert!(matches!(
            events.recv().await.unwrap(),
            ImageGcEvent::RoundFailed { .. }
        ));
        assert!(matches!(
            events.recv().await.unwrap(),
            ImageGcEvent::ImageGcFailed { .. }
        ));
        let c = m.counters();
        assert_eq!((c.runs, c.failures), (2, 2));
        let e = m.delete_unused_images().await.unwrap_err();
        assert!(e.is_runtime_down());
        assert!(matches!(
            events.recv().await.unwrap(),
            ImageGcEvent::RoundFailed {
                trigger: GcTrigger::Reclaim,
                ..
            }
        ));
    }
}
