//! The manager's loop: the kubelet's `Start` (an initial detection, the image list refresh)
//! and its periodic `GarbageCollect`, on one Tokio task that only ends when stopped.

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::manager::ImageGcManager;

impl ImageGcManager {
    /// Starts the manager's loop on the current Tokio runtime: an initial detection (the
    /// kubelet's `Start`), then every `period` a GC round — or only a detection when the
    /// high threshold is 100 — and every `list_refresh` an image list refresh. Failed rounds
    /// are reported and retried next period; the loop ends only when stopped.
    pub fn spawn(&self) -> GcTask {
        let (stop_tx, stop_rx) = oneshot::channel();
        let manager = self.clone();
        let handle = tokio::spawn(async move { manager.run(stop_rx).await });
        GcTask {
            stop: Some(stop_tx),
            handle,
        }
    }

    async fn run(self, mut stop: oneshot::Receiver<()>) {
        let settings = self.settings().clone();
        if let Err(e) = self.detect_images().await {
            tracing::warn!("[imageGCManager] Failed to monitor images: {e}");
        }
        let mut gc = tokio::time::interval(settings.period);
        gc.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut refresh = tokio::time::interval(settings.list_refresh);
        refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        if !settings.periodic_gc_enabled() {
            tracing::info!("imageGCHighThresholdPercent is 100: periodic image GC is off (disk-pressure reclaim still runs)");
        }
        loop {
            tokio::select! {
                _ = &mut stop => break,
                _ = gc.tick() => {
                    if settings.periodic_gc_enabled() {
                        // Outcomes go out as events; the loop carries on either way.
                        let _ = self.garbage_collect().await;
                    } else if let Err(e) = self.detect_images().await {
                        tracing::warn!("[imageGCManager] Failed to monitor images: {e}");
                    }
                }
                _ = refresh.tick() => {
                    if let Err(e) = self.refresh_image_list().await {
                        tracing::warn!("[imageGCManager] Failed to update image list: {e}");
                    }
                }
            }
        }
    }
}

/// The running GC loop; stop it with [`GcTask::stop`] (dropping it leaves the loop running
/// until the runtime shuts down).
#[derive(Debug)]
pub struct GcTask {
    stop: Option<oneshot::Sender<()>>,
    handle: JoinHandle<()>,
}

impl GcTask {
    /// Whether the loop is still running.
    pub fn is_running(&self) -> bool {
        !self.handle.is_finished()
    }

    /// Stops the loop (after the round in progress, if any) and waits for it.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.handle).await;
    }
}
