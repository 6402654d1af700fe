//! Which watched cgroups the kernel itself is checking at their working-set level right now,
//! for the reactor loop to read on every pass.
//!
//! The loop re-reads the signals every `close_poll` (1 ms) while a memory signal is near a
//! threshold, because a notification placed on usage can come late: the v1 eventfd is checked
//! every 128 charged pages per CPU and its level goes stale as the page cache moves. An
//! armed eBPF slot that follows the page cache has neither problem: the charge program checks
//! the working set on every page charged near the level and writes its record at the
//! crossing. While such a
//! slot watches a threshold, the loop's 1 ms re-reads only race the kernel's record (a read
//! that lands between the crossing and the record takes the kill, a fraction of a
//! millisecond sooner at best) and cost the node a thousand cgroupfs reads a second just when
//! it is short of memory; the loop then re-reads at a slower safety-net interval instead.
//!
//! A slot counts as watching only while all of these hold, each set by what knows it:
//!
//! - the charge programs are on their tracepoint: the charge switch says so after an attach
//!   and before a detach, so the loop never trusts a program that is coming off;
//! - the slot follows the page cache (a working-set level) and was armed when written: the
//!   table's owner says so when it writes the slot;
//! - it has not fired since: the drain clears it when the slot's record arrives (the record
//!   itself wakes the loop), and the table's owner reads the kernel's `armed` flags again on
//!   each look while the programs are on, which is when a fired slot re-arms in the kernel.
//!
//! Every change toward "not watching" happens no later than the kernel stops watching, and
//! every change toward "watching" no earlier than it starts, so the loop errs on the side of
//! polling.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use agent_ebpf::MAX_THRESHOLDS;

use super::near::Arming;

/// Shared view of the kernel's usage watches (cheap to clone). The default watches nothing.
#[derive(Clone, Debug, Default)]
pub struct KernelWatch {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// The charge programs are on their tracepoint.
    attached: AtomicBool,
    /// Told each time they come on: a watched cgroup is near its level, and the loop stages
    /// its victim for the crossing ([`super::stage`]).
    came_on: tokio::sync::Notify,
    /// The same, for the slots' owner ([`super::threshold`]): it reads the page cache the
    /// programs follow anew as soon as they are on, before the first crossing they check.
    attached_again: tokio::sync::Notify,
    /// Per slot: its cgroup, its working-set level (`None`: a usage level, which does not
    /// follow the page cache) and whether it is armed.
    slots: Mutex<Vec<Slot>>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Slot {
    cgroup: String,
    working_set_bytes: Option<u64>,
    armed: bool,
    /// Where the last look found it, when the programs are armed only near a level.
    arming: Option<ArmingReport>,
}

/// What the last look found for one watched cgroup: why the charge programs are on or off
/// for it ([`super::near`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ArmingReport {
    /// Far, cached or near.
    pub arming: Arming,
    /// Its usage, bytes.
    pub usage_bytes: u64,
    /// Its inactive file pages as last read (or followed by the kernel), bytes.
    pub inactive_file_bytes: u64,
    /// The level it is watched at: a working set, or a usage for a usage level.
    pub level_bytes: u64,
    /// How far below the level the programs attach.
    pub reach_bytes: u64,
}

/// One watched cgroup's arming, for `reactor status`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct WatchedArming {
    /// The cgroup (`/kubepods`).
    pub cgroup: String,
    /// What the last look found.
    pub report: ArmingReport,
}

impl KernelWatch {
    /// The slots, locked (a poisoned lock still holds whole slots: each write replaces one).
    fn slots(&self) -> std::sync::MutexGuard<'_, Vec<Slot>> {
        self.inner
            .slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the kernel will write a record when `cgroup`'s working set reaches
    /// `working_set_bytes` (within `slack_bytes` above it): the charge programs are on and an
    /// armed slot following the page cache watches that cgroup at or below that level.
    pub(crate) fn watches(&self, cgroup: &str, working_set_bytes: u64, slack_bytes: u64) -> bool {
        if !self.inner.attached.load(Ordering::Acquire) {
            return false;
        }
        let slots = self.slots();
        slots.iter().any(|s| {
            s.armed
                && s.cgroup == cgroup
                && s.working_set_bytes
                    .is_some_and(|ws| ws <= working_set_bytes.saturating_add(slack_bytes))
        })
    }

    /// The charge programs are on (`true`, after attaching) or coming off (`false`, before
    /// detaching).
    pub(crate) fn set_attached(&self, on: bool) {
        let was = self.inner.attached.swap(on, Ordering::AcqRel);
        if on && !was {
            self.inner.came_on.notify_one();
            self.inner.attached_again.notify_one();
        }
    }

    /// Whether the charge programs are on their tracepoint now.
    pub fn attached(&self) -> bool {
        self.inner.attached.load(Ordering::Acquire)
    }

    /// Waits until the charge programs come on (at once if they came on since the last
    /// wait returned). One waiter: the reactor loop.
    pub(crate) async fn came_on(&self) {
        self.inner.came_on.notified().await;
    }

    /// Waits until the charge programs come on (at once if they came on since the last
    /// wait returned). One waiter: the slots' owner.
    pub(crate) async fn attached_again(&self) {
        self.inner.attached_again.notified().await;
    }

    /// Slot `index` was written: on `cgroup`, at `working_set_bytes` when it follows the page
    /// cache, armed or not.
    pub(crate) fn set_slot(
        &self,
        index: usize,
        cgroup: &str,
        working_set_bytes: Option<u64>,
        armed: bool,
    ) {
        if index >= MAX_THRESHOLDS {
            return;
        }
        let mut slots = self.slots();
        if slots.len() <= index {
            slots.resize(index + 1, Slot::default());
        }
        let arming = slots[index]
            .arming
            .filter(|_| slots[index].cgroup == cgroup);
        slots[index] = Slot {
            cgroup: cgroup.to_string(),
            working_set_bytes,
            armed,
            arming,
        };
    }

    /// The last look found slot `index`'s cgroup as `report` says.
    pub(crate) fn set_arming(&self, index: usize, report: ArmingReport) {
        let mut slots = self.slots();
        if let Some(slot) = slots.get_mut(index) {
            slot.arming = Some(report);
        }
    }

    /// Each watched cgroup's arming as the last look found it (none where the programs are
    /// not armed only near a level), one per cgroup: its nearest slot.
    pub(crate) fn arming(&self) -> Vec<WatchedArming> {
        let slots = self.slots();
        let mut out: Vec<WatchedArming> = Vec::new();
        for slot in slots.iter() {
            let Some(report) = slot.arming else { continue };
            match out.iter_mut().find(|w| w.cgroup == slot.cgroup) {
                Some(w) if report.arming > w.report.arming => w.report = report,
                Some(_) => {}
                None => out.push(WatchedArming {
                    cgroup: slot.cgroup.clone(),
                    report,
                }),
            }
        }
        out
    }

    /// The kernel says each slot's `armed` flag is now as given (index order).
    pub(crate) fn set_armed(&self, armed: impl IntoIterator<Item = bool>) {
        let mut slots = self.slots();
        for (slot, armed) in slots.iter_mut().zip(armed) {
            slot.armed = armed;
        }
    }

    /// Slot `index` fired (its record arrived): the kernel disarmed it.
    pub(crate) fn fired(&self, index: usize) {
        let mut slots = self.slots();
        if let Some(slot) = slots.get_mut(index) {
            slot.armed = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[tokio::test]
    async fn the_loop_is_told_each_time_the_programs_come_on() {
        let w = KernelWatch::default();
        let soon = std::time::Duration::from_millis(50);
        w.set_attached(true);
        assert!(w.attached());
        tokio::time::timeout(soon, w.came_on())
            .await
            .expect("told when they came on before the wait");
        w.set_attached(true);
        assert!(
            tokio::time::timeout(soon, w.came_on()).await.is_err(),
            "on already: nothing new"
        );
        w.set_attached(false);
        assert!(!w.attached());
        assert!(tokio::time::timeout(soon, w.came_on()).await.is_err());
        w.set_attached(true);
        tokio::time::timeout(soon, w.came_on())
            .await
            .expect("told again after coming off");
        // The slots' owner is told apart from the loop, once per coming on.
        tokio::time::timeout(soon, w.attached_again())
            .await
            .expect("the slots' owner is told too");
        assert!(tokio::time::timeout(soon, w.attached_again())
            .await
            .is_err());
    }

    #[test]
    fn watches_only_an_armed_following_slot_at_or_below_the_level_while_attached() {
        let w = KernelWatch::default();
        assert!(!w.watches("/kubepods", 384 * MIB, MIB), "nothing placed");
        w.set_slot(0, "/kubepods", Some(384 * MIB + 1), true);
        assert!(!w.watches("/kubepods", 384 * MIB, MIB), "programs off");
        w.set_attached(true);
        assert!(w.watches("/kubepods", 384 * MIB, MIB));
        assert!(
            !w.watches("/kubepods", 380 * MIB, MIB),
            "the slot is above this level"
        );
        assert!(!w.watches("/", 384 * MIB, MIB), "another cgroup");
        w.fired(0);
        assert!(
            !w.watches("/kubepods", 384 * MIB, MIB),
            "fired, not re-armed"
        );
        w.set_armed([true]);
        assert!(
            w.watches("/kubepods", 384 * MIB, MIB),
            "re-armed in the kernel"
        );
        w.set_attached(false);
        assert!(
            !w.watches("/kubepods", 384 * MIB, MIB),
            "programs coming off"
        );
    }

    #[test]
    fn a_usage_level_does_not_count_as_watching_the_working_set() {
        let w = KernelWatch::default();
        w.set_attached(true);
        w.set_slot(1, "/kubepods", None, true);
        assert!(!w.watches("/kubepods", 384 * MIB, MIB));
        // A lower slot of the same cgroup (a soft threshold's) notifies first: it covers.
        w.set_slot(0, "/kubepods", Some(300 * MIB), true);
        assert!(w.watches("/kubepods", 384 * MIB, MIB));
        w.set_slot(MAX_THRESHOLDS, "/x", Some(1), true);
        assert!(!w.watches("/x", MIB, MIB), "out-of-range slots are ignored");
    }
}
