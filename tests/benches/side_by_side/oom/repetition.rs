//! One repetition of a mode: its hog against the running loop, what the loop's decisions
//! and the bench's watch say of it kept in a [`Rep`], and when the agent's SIGKILL went out
//! ([`kill_at`]).

use std::time::Duration;

use anyhow::Result;
use reactor::reactor::{Action, Decision};
use reactor::sense::{monotonic_ns, Kind};
use reactor_tests::node::Node;
use tokio::sync::broadcast::error::RecvError;

use super::hog::{clean_up, start_hog};
use super::records::{Basis, Rep};
use crate::page_cache::CacheCgroup;

/// When the agent's SIGKILL went out: a kill at the crossing's own time (the program's, at
/// the charge that crossed: the pass that completed it may have been woken by another, later
/// record), else the waking event plus the reaction lag, else the moment the signals were
/// read just before it.
fn kill_at(d: &Decision) -> u64 {
    if let Some(k) = d.crossing_kill {
        return k.at_ns;
    }
    match (&d.wake.event, d.reaction_lag_ns) {
        (Some(e), Some(l)) => e.at_ns + l,
        _ => d.observed_at_ns + d.decide_to_kill_ns.unwrap_or(0),
    }
}

/// One repetition; with `cache` (the cache-full variant) the crossing is clocked on
/// kubepods' working set ([`Basis::WorkingSet`]) and the cache is freed before the node is
/// settled again.
pub(super) async fn repetition(
    node: &mut Node,
    uid: &str,
    rate: u64,
    cache: Option<&mut CacheCgroup>,
) -> Result<Rep> {
    let basis = match cache {
        Some(_) => Basis::WorkingSet,
        None => Basis::Usage,
    };
    let (clock, ooms) = start_hog(node, uid, rate, basis).await?;
    let mut rep = Rep::default();
    let mut oom_at: Option<u64> = None;
    let mut evicted: Option<Decision> = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let oom0 = ooms();
    loop {
        let lp = node.lp();
        tokio::select! {
            d = lp.decisions.recv() => match d {
                Ok(d) if matches!(d.action, Action::Evicted { .. }) => {
                    evicted = Some(d);
                    break;
                }
                Ok(_) | Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => break,
            },
            () = tokio::time::sleep(Duration::from_millis(2)) => {
                if oom_at.is_none() && ooms() > oom0 {
                    oom_at = Some(monotonic_ns());
                }
                // After a kernel kill, give the agent a moment to show what it did.
                if oom_at.is_some_and(|t| monotonic_ns() - t > 300_000_000) {
                    break;
                }
            },
            () = tokio::time::sleep_until(deadline) => break,
        }
    }
    // The victim's exit by the bench's own watch, as the reference times it: begun now, a
    // fraction of a millisecond after the kill (the record comes at the end of the pass that
    // completed it), against an exit of 10 ms or more.
    let empty_at = match evicted.as_ref().map(|d| &d.action) {
        Some(Action::Evicted { uid: victim, .. }) if victim == uid => {
            Some(super::reference::watch_empty(node, uid)?)
        }
        _ => None,
    };
    // Entries are final once complete, so the record may be read with the hog still running
    // (no eviction, or a kernel kill of another pod).
    let (crossing, clock_rep) = clock.read();
    rep.clock = clock_rep;
    // The eviction's second record says when the victim's memory was back.
    let mut release_ns = None;
    if let Some(Action::Evicted { uid: victim, .. }) = evicted.as_ref().map(|d| &d.action) {
        let until = tokio::time::Instant::now() + Duration::from_secs(12);
        loop {
            match tokio::time::timeout_at(until, node.lp().decisions.recv()).await {
                Ok(Ok(d)) => {
                    if let Action::Released {
                        uid: u, released, ..
                    } = &d.action
                    {
                        if u == victim {
                            release_ns = d.release_ns.filter(|_| *released);
                            break;
                        }
                    }
                }
                Ok(Err(RecvError::Lagged(_))) => {}
                Ok(Err(RecvError::Closed)) | Err(_) => break,
            }
        }
    }
    if let Some(d) = &evicted {
        let k = kill_at(d);
        rep.oom_first = oom_at.is_some_and(|o| o <= k);
        if let Action::Evicted { uid: victim, .. } = &d.action {
            rep.right = victim == uid;
            rep.evicted = Some(victim.clone());
            {
                if let (Some(c), Some(r)) = (crossing, release_ns) {
                    rep.crossing_to_released_ns = Some((k + r).saturating_sub(c));
                    rep.crossing_to_kill_ns = Some(k.saturating_sub(c));
                    rep.kill_to_released_ns = Some(r);
                    // Two CLOCK_MONOTONIC times: their difference fits an i64.
                    rep.kill_after_crossing_ns = Some(k.wrapping_sub(c) as i64);
                }
                if let Some((at, first)) = empty_at {
                    rep.kill_to_empty_ns = Some(at.saturating_sub(k));
                    rep.empty_at_first_look = first;
                }
            }
        }
        rep.reaction_ns = d.reaction_lag_ns;
        rep.at_crossing = d.killed_at_crossing.is_some();
        rep.crossing_kill = d.crossing_kill;
        rep.observe_to_kill_ns = d.decide_to_kill_ns;
        rep.observe_to_kill_cpu_ns = d.decide_to_kill_cpu_ns;
        if let (Some(e), false, Some(c)) = (&d.wake.event, d.wake.timer, crossing) {
            rep.event_after_crossing_ns = Some(e.at_ns.wrapping_sub(c) as i64);
            if let Kind::ThresholdCrossed {
                usage_bytes,
                threshold_bytes,
                ..
            } = e.kind
            {
                rep.event_usage = usage_bytes;
                rep.event_threshold = threshold_bytes;
            }
        }
        rep.wake_event = d.wake.event.as_ref().map(|e| e.kind.to_string());
        rep.woken_by = Some(if d.wake.timer {
            "timer".to_string()
        } else {
            d.wake
                .event
                .as_ref()
                .map_or("timer".to_string(), |e| e.source.name().to_string())
        });
    } else {
        rep.oom_first = oom_at.is_some() || ooms() > oom0;
    }
    // The cache goes first: kubepods full of it would keep the settle below waiting.
    if let Some(cache) = cache {
        if evicted.is_some() {
            let kubepods = std::path::Path::new(reactor_tests::MEMCG_V1_ROOT)
                .join(&node.root.name)
                .join("kubepods");
            rep.after_kill = crate::page_cache::folded_stat(&kubepods, &cache.dir).ok();
        }
        cache.empty();
    }
    clean_up(node, uid).await;
    while node.lp().decisions.try_recv().is_ok() {}
    Ok(rep)
}
