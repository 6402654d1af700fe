//! The ring-buffer reader: [`EbpfSource::run`] wakes on the ring's readiness, turns each
//! record into a [`PressureEvent`] named from the cgroup cache, and hands the records that
//! need I/O to be named to a resolver on a blocking thread; it also relays the programs' log,
//! follows moving usage thresholds, and reports ring-buffer drops.

use std::collections::HashMap as StdHashMap;

use aya::maps::{HashMap, MapData, PerCpuArray};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::mpsc::Sender;

use super::cgroup::{self, CgroupNames};
use super::decode::{self, comm_str, Record};
use super::threshold::UsageThresholds;
use super::{monotonic_ns, EbpfError, EbpfSource};
use crate::sense::{KilledAtCrossing, Kind, PressureEvent, Source};

impl EbpfSource {
    /// Records lost so far because the ring buffer was full (sum over CPUs). Here beside the
    /// drain that reports them, so the parent does not reach into its child.
    pub fn drops(&self) -> u64 {
        read_drops(&self.drops)
    }

    /// Reads the ring buffer until `tx` is closed, sending one [`PressureEvent`] per record
    /// and a [`Kind::Dropped`] event whenever the drop counter grew.
    ///
    /// Wakes on the ring buffer's epoll readiness (no polling loop); the drop counter is
    /// checked every [`EbpfOptions::drop_check_interval`](super::EbpfOptions::drop_check_interval). Each record is handed on as soon
    /// as it is read, its slot given back to the kernel first. The drain does no I/O for a
    /// name: a record whose cgroup is not in the [`cgroup::NameCache`] (a new cgroup, an id
    /// to look up by pid, an OOM victim the kernel could not attribute) goes to a resolver
    /// on a blocking thread, which sends it on once resolved. A cgroup's records keep their
    /// ring order: while one of its records is with the resolver, the ones after it follow
    /// it there even if its name is cached by then; records of other cgroups do not wait. A
    /// full channel blocks the reader; records that then do not fit in the ring buffer are
    /// dropped in the kernel and counted, so a slow consumer shows up as `Dropped` events
    /// rather than as unbounded memory.
    pub async fn run(self, tx: Sender<PressureEvent>) -> Result<(), EbpfError> {
        let EbpfSource {
            _programs,
            ring,
            drops,
            victims,
            items,
            names,
            opts,
            usage,
            logger,
            events_switch,
            kernel_watch,
            ..
        } = self;
        // Reclaim stalls wake the memcg events program, when it is switched: told at most
        // once a second (the switch keeps it for its hold after the last one).
        let mut told_reclaim: Option<std::time::Instant> = None;
        let mut usage = usage;
        let mut logger = match logger {
            // SAFETY: the logger owns its ring buffer's map fd (a `MapData`) and keeps it open,
            // unchanged, for as long as the AsyncFd owns the logger.
            Some(l) => match unsafe { AsyncFd::register_with_interest(l, Interest::READABLE) } {
                Ok(fd) => Some(fd),
                Err(e) => {
                    tracing::debug!("eBPF: program log not relayed: {e}");
                    None
                }
            },
            None => None,
        };
        let cache = names.cache();
        let items = std::sync::Arc::new(items);
        let (slow_tx, slow_rx) = tokio::sync::mpsc::channel::<Slow>(SLOW_QUEUE);
        let with_resolver = WithResolver::default();
        {
            let (tx, items, with) = (tx.clone(), items.clone(), with_resolver.clone());
            tokio::task::spawn_blocking(move || {
                resolve(slow_rx, names, victims, &items, &tx, &with)
            });
        }
        // SAFETY: the RingBuf owns its map fd (a `MapData`) and keeps it open, unchanged,
        // for as long as the AsyncFd owns the RingBuf.
        let mut ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(|e| EbpfError::Io(e.into()))?;
        let mut tick = tokio::time::interval(opts.drop_check_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The counter starts at 0 when the object loads, so drops before `run` are reported too.
        let mut reported = 0u64;
        loop {
            tokio::select! {
                ready = ring.readable_mut() => {
                    let mut guard = ready?;
                    let pass = monotonic_ns();
                    let mut taken = 0;
                    loop {
                        // The item (a borrow of the ring) is dropped at the end of this
                        // statement, giving its slot back before the event is sent.
                        let Some(decoded) = guard.get_inner_mut().next().map(|i| decode::decode(&i))
                        else {
                            guard.clear_ready();
                            break;
                        };
                        taken += 1;
                        match decoded {
                            Ok(rec) => {
                                // The kernel disarmed the slot at this crossing: the loop
                                // must not count on it until it re-arms.
                                if let Record::Threshold(t) = &rec {
                                    kernel_watch.fired(t.slot as usize);
                                    if t.kill_error != 0 {
                                        let (pid, error) = (t.header.pid, t.kill_error);
                                        tracing::warn!(pid, error, "eBPF: the staged victim's process was not killed at the crossing (bpf_send_signal failed); the loop evicts it");
                                    }
                                }
                                if let Record::Stall(_) = &rec {
                                    // A cgroup within reach only by its page cache may be
                                    // reclaiming it for a hog: look again.
                                    if let Some(u) = usage.as_mut() {
                                        u.reclaim_seen();
                                    }
                                    if let Some(s) = &events_switch {
                                        if told_reclaim.is_none_or(|t| t.elapsed() >= RECLAIM_TELL) {
                                            s.reclaim_seen();
                                            told_reclaim = Some(std::time::Instant::now());
                                        }
                                    }
                                }
                                // Written during this pass: it did not wait for a wake-up.
                                let woke = pass.max(rec.header().at_ns);
                                let mut fast = CacheOnly { cache: &cache, missed: false };
                                let mut event = to_event(&rec, &items, &mut fast);
                                let id = rec.header().cgroup_id;
                                let sent = if fast.missed || with_resolver.holds(id) {
                                    with_resolver.add(id);
                                    slow_tx.send(Slow { rec, woke }).await.is_ok()
                                } else {
                                    event.woke_ns = Some(woke);
                                    tx.send(event).await.is_ok()
                                };
                                if !sent {
                                    return Ok(());
                                }
                            }
                            Err(e) => tracing::warn!("eBPF: {e}"),
                        }
                        // Let the drop check have its turn under a flood (still ready).
                        if taken >= PASS_RECORDS {
                            break;
                        }
                    }
                }
                () = follow_usage(usage.as_mut()) => {}
                () = flush_log(logger.as_mut()) => {}
                _ = tick.tick() => {
                    let now = read_drops(&drops);
                    if now > reported {
                        let count = now - reported;
                        reported = now;
                        tracing::warn!(count, total = now, "eBPF ring buffer full: events dropped");
                        let event = PressureEvent {
                            at_ns: monotonic_ns(),
                            woke_ns: None,
                            source: Source::Ebpf,
                            cgroup: None,
                            kind: Kind::Dropped { count },
                        };
                        if tx.send(event).await.is_err() {
                            return Ok(());
                        }
                    }
                    if tx.is_closed() {
                        return Ok(());
                    }
                }
            }
        }
    }
}

/// Moves usage thresholds as their levels move (never returns without any).
async fn follow_usage(usage: Option<&mut UsageThresholds>) {
    match usage {
        Some(u) => u.follow().await,
        None => std::future::pending().await,
    }
}

/// Relays the programs' log records to the agent's log (never returns without a log ring).
async fn flush_log(logger: Option<&mut AsyncFd<aya_log::EbpfLogger<&'static dyn log::Log>>>) {
    let Some(logger) = logger else {
        return std::future::pending().await;
    };
    match logger.readable_mut().await {
        Ok(mut guard) => {
            guard.get_inner_mut().flush();
            guard.clear_ready();
        }
        Err(_) => std::future::pending().await,
    }
}

/// Records read in one pass before the drain lets the drop check run.
const PASS_RECORDS: usize = 256;
/// Records that may wait for the resolver before the drain waits for it.
const SLOW_QUEUE: usize = 4096;
/// The least time between two reclaim stalls told to the program switch.
const RECLAIM_TELL: std::time::Duration = std::time::Duration::from_secs(1);

/// A record whose cgroup needs I/O to name, for the resolver.
struct Slow {
    rec: Record,
    woke: u64,
}

/// How [`to_event`] names cgroups: from the cache alone on the drain path, with I/O in the
/// resolver.
trait Names {
    /// The path of memory cgroup `id`.
    fn by_id(&mut self, id: u64) -> Option<String>;
    /// The memory cgroup of task `pid`.
    fn by_pid(&mut self, pid: u32) -> Option<String>;
    /// The memcg id the raw `mark_victim` program stored for OOM victim `pid`.
    fn victim(&mut self, pid: u32) -> Option<u64>;
}

/// The drain's names: cache hits only; anything else marks the record for the resolver.
struct CacheOnly<'a> {
    cache: &'a cgroup::NameCache,
    missed: bool,
}

impl Names for CacheOnly<'_> {
    fn by_id(&mut self, id: u64) -> Option<String> {
        let hit = self.cache.get(id);
        self.missed |= hit.is_none() && id != 0;
        hit
    }

    fn by_pid(&mut self, _pid: u32) -> Option<String> {
        self.missed = true;
        None
    }

    fn victim(&mut self, _pid: u32) -> Option<u64> {
        self.missed = true;
        None
    }
}

/// The resolver's names: file handles or a walk, `/proc/<pid>/cgroup`, the victims map.
struct Resolver<'a> {
    names: &'a mut CgroupNames,
    victims: Option<&'a mut HashMap<MapData, u32, u64>>,
}

impl Names for Resolver<'_> {
    fn by_id(&mut self, id: u64) -> Option<String> {
        self.names.by_id(id)
    }

    fn by_pid(&mut self, pid: u32) -> Option<String> {
        self.names.by_pid(pid)
    }

    fn victim(&mut self, pid: u32) -> Option<u64> {
        let victims = self.victims.as_mut()?;
        let id = victims.get(&pid, 0).ok();
        let _ = victims.remove(&pid);
        id
    }
}

/// The resolver: names the records the drain could not and sends them on, until either
/// channel closes. Runs on a blocking thread (it does file I/O and map syscalls).
fn resolve(
    mut rx: tokio::sync::mpsc::Receiver<Slow>,
    mut names: CgroupNames,
    mut victims: HashMap<MapData, u32, u64>,
    items: &StdHashMap<u32, String>,
    tx: &Sender<PressureEvent>,
    with: &WithResolver,
) {
    while let Some(Slow { rec, woke }) = rx.blocking_recv() {
        let mut full = Resolver {
            names: &mut names,
            victims: Some(&mut victims),
        };
        let mut event = to_event(&rec, items, &mut full);
        event.woke_ns = Some(woke);
        let sent = tx.blocking_send(event).is_ok();
        // Only once it is sent: a record of the same cgroup the drain reads meanwhile, its
        // name cached by the lookup above, must still queue behind it.
        with.done(rec.header().cgroup_id);
        if !sent {
            return;
        }
    }
}

/// How many records of each cgroup (by the id in the record's header) the resolver holds:
/// the drain sends a record straight on only when none of its cgroup's is there, so a
/// cgroup's records are never reordered (seen in CI: a new cgroup's reclaim stall went to
/// the resolver, the resolver cached the name, and the OOM kill read right after it was
/// sent straight on, ahead of the stall). One atomic load per record while it holds none.
#[derive(Clone, Default)]
struct WithResolver(std::sync::Arc<WithResolverInner>);

#[derive(Default)]
struct WithResolverInner {
    total: std::sync::atomic::AtomicUsize,
    by_id: std::sync::Mutex<StdHashMap<u64, usize>>,
}

impl WithResolver {
    fn holds(&self, id: u64) -> bool {
        use std::sync::atomic::Ordering;
        if self.0.total.load(Ordering::Acquire) == 0 {
            return false;
        }
        let by_id = self.0.by_id.lock().unwrap_or_else(|e| e.into_inner());
        by_id.contains_key(&id)
    }

    fn add(&self, id: u64) {
        use std::sync::atomic::Ordering;
        let mut by_id = self.0.by_id.lock().unwrap_or_else(|e| e.into_inner());
        *by_id.entry(id).or_insert(0) += 1;
        self.0.total.fetch_add(1, Ordering::Release);
    }

    fn done(&self, id: u64) {
        use std::sync::atomic::Ordering;
        let mut by_id = self.0.by_id.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = by_id.get_mut(&id) {
            *n -= 1;
            if *n == 0 {
                by_id.remove(&id);
            }
            self.0.total.fetch_sub(1, Ordering::Release);
        }
    }
}

fn read_drops(drops: &PerCpuArray<MapData, u64>) -> u64 {
    match drops.get(&0, 0) {
        Ok(values) => values.iter().copied().fold(0u64, u64::saturating_add),
        Err(e) => {
            tracing::warn!("eBPF: cannot read the drop counter: {e}");
            0
        }
    }
}

/// Turns a decoded record into the agent's event, naming its cgroup through `names` (whose
/// `victim` looks an OOM victim up in the raw tracepoint's map). `woke_ns` is left for the
/// caller.
fn to_event(rec: &Record, items: &StdHashMap<u32, String>, names: &mut dyn Names) -> PressureEvent {
    let header = *rec.header();
    let (cgroup, kind) = match rec {
        Record::Oom(e) => {
            // The kernel put the victim's memcg in the record unless the raw tracepoint had
            // not run yet; only then look in its map (an LRU map: entries left there age out).
            let victims_id = if e.cgroup_from == agent_ebpf::OOM_CGROUP_OF_INVOKER {
                names.victim(header.pid)
            } else {
                Some(header.cgroup_id)
            };
            let cgroup = victims_id
                .and_then(|id| names.by_id(id))
                .or_else(|| names.by_pid(header.pid))
                .or_else(|| names.by_id(header.cgroup_id));
            let rss_kb = e
                .anon_rss_kb
                .saturating_add(e.file_rss_kb)
                .saturating_add(e.shmem_rss_kb);
            let kind = Kind::OomKill {
                pid: Some(header.pid),
                comm: Some(comm_str(&e.comm)),
                rss_bytes: Some(rss_kb.saturating_mul(1024)),
                oom_score_adj: Some(e.oom_score_adj),
            };
            (cgroup, kind)
        }
        Record::Stall(e) => {
            let cgroup = names
                .by_id(header.cgroup_id)
                .or_else(|| names.by_pid(header.pid));
            let kind = Kind::ReclaimStall {
                pid: header.pid,
                duration_ns: e.duration_ns,
                memcg: e.memcg == 1,
                folded: e.folded,
                folded_ns: e.folded_ns,
            };
            (cgroup, kind)
        }
        Record::Memcg(e) => {
            let item = items
                .get(&e.item)
                .cloned()
                .unwrap_or_else(|| format!("item{}", e.item));
            let kind = Kind::MemcgEvent {
                item,
                count: e.count,
            };
            (names.by_id(header.cgroup_id), kind)
        }
        Record::Threshold(e) => {
            // The watched cgroup (remembered when it was armed), not the charged descendant.
            let page = rustix::param::page_size() as u64;
            let kind = Kind::ThresholdCrossed {
                threshold_bytes: Some(e.threshold_pages.saturating_mul(page)),
                usage_bytes: Some(e.usage_pages.saturating_mul(page)),
                killed: (e.killed_pid != 0).then_some(KilledAtCrossing {
                    pid: e.killed_pid,
                    cgroup_id: e.victim_cgroup_id,
                }),
            };
            (names.by_id(header.cgroup_id), kind)
        }
    };
    PressureEvent {
        at_ns: header.at_ns,
        woke_ns: None,
        source: Source::Ebpf,
        cgroup,
        kind,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cgroup_with_a_record_at_the_resolver_holds_its_next_ones_until_it_is_sent() {
        let with = WithResolver::default();
        assert!(!with.holds(7), "nothing held at first");
        with.add(7);
        with.add(7);
        assert!(with.holds(7));
        assert!(!with.holds(8), "another cgroup's records do not wait");
        with.done(7);
        assert!(with.holds(7), "one of two still at the resolver");
        with.done(7);
        assert!(!with.holds(7));
        with.done(7); // a stray done changes nothing
        with.add(8);
        assert!(with.holds(8) && !with.holds(7));
    }

    #[test]
    fn threshold_records_name_the_watched_cgroup_in_bytes() {
        let mut cgroups = CgroupNames::new(None);
        cgroups.remember(42, "/kubepods".into());
        let mut names = Resolver {
            names: &mut cgroups,
            victims: None,
        };
        let page = rustix::param::page_size() as u64;
        let rec = Record::Threshold(agent_ebpf::ThresholdEvent {
            header: agent_ebpf::Header {
                at_ns: 5,
                cgroup_id: 42,
                kind: agent_ebpf::KIND_THRESHOLD,
                pid: 9,
            },
            usage_pages: 101,
            threshold_pages: 100,
            charged_cgroup_id: 43,
            slot: 1,
            killed_pid: 0,
            inactive_pages: 0,
            victim_cgroup_id: 0,
            kill_error: 0,
            _pad: 0,
        });
        let ev = to_event(&rec, &StdHashMap::new(), &mut names);
        assert_eq!(ev.cgroup.as_deref(), Some("/kubepods"));
        assert_eq!(ev.at_ns, 5);
        assert_eq!(
            ev.kind,
            Kind::ThresholdCrossed {
                threshold_bytes: Some(100 * page),
                usage_bytes: Some(101 * page),
                killed: None,
            }
        );
        // A crossing at which the program killed the staged victim's process.
        let Record::Threshold(mut killed) = rec else {
            unreachable!()
        };
        killed.killed_pid = 77;
        killed.victim_cgroup_id = 44;
        let ev = to_event(&Record::Threshold(killed), &StdHashMap::new(), &mut names);
        let text = ev.kind.to_string();
        assert!(text.contains("killed-at-crossing pid=77"), "{text}");
        let Kind::ThresholdCrossed { killed, .. } = ev.kind else {
            panic!("{:?}", ev.kind)
        };
        assert_eq!(
            killed,
            Some(KilledAtCrossing {
                pid: 77,
                cgroup_id: 44
            })
        );
    }

    #[test]
    fn records_become_events_with_names() {
        let mut cgroups = CgroupNames::new(None);
        let mut names = Resolver {
            names: &mut cgroups,
            victims: None,
        };
        let mut items = StdHashMap::new();
        items.insert(7, "pgscan_direct".to_string());
        let memcg = Record::Memcg(agent_ebpf::MemcgEvent {
            header: agent_ebpf::Header {
                at_ns: 11,
                cgroup_id: 0,
                kind: agent_ebpf::KIND_MEMCG,
                pid: 1,
            },
            item: 7,
            _pad: 0,
            count: 32,
        });
        let ev = to_event(&memcg, &items, &mut names);
        assert_eq!(ev.at_ns, 11);
        assert_eq!(ev.source, Source::Ebpf);
        assert_eq!(
            ev.kind,
            Kind::MemcgEvent {
                item: "pgscan_direct".into(),
                count: 32
            }
        );
        let unknown = Record::Memcg(agent_ebpf::MemcgEvent {
            item: 99,
            ..match memcg {
                Record::Memcg(m) => m,
                _ => unreachable!(),
            }
        });
        let ev = to_event(&unknown, &items, &mut names);
        assert!(matches!(ev.kind, Kind::MemcgEvent { ref item, .. } if item == "item99"));
    }

    #[test]
    fn the_drain_names_from_the_cache_and_hands_misses_on() {
        let mut cgroups = CgroupNames::new(None);
        cgroups.remember(42, "/kubepods/pod1".into());
        let cache = cgroups.cache();
        let stall = |cgroup_id| {
            Record::Stall(agent_ebpf::StallEvent {
                header: agent_ebpf::Header {
                    at_ns: 5,
                    cgroup_id,
                    kind: agent_ebpf::KIND_STALL,
                    pid: 7,
                },
                duration_ns: 1000,
                memcg: 1,
                ..Default::default()
            })
        };
        let items = StdHashMap::new();
        let mut fast = CacheOnly {
            cache: &cache,
            missed: false,
        };
        let ev = to_event(&stall(42), &items, &mut fast);
        assert!(!fast.missed);
        assert_eq!(ev.cgroup.as_deref(), Some("/kubepods/pod1"));
        assert_eq!(
            ev.woke_ns, None,
            "the drain stamps the wake-up, not to_event"
        );
        // An id the cache lacks needs the resolver (a lookup, then `/proc/<pid>/cgroup`).
        let mut fast = CacheOnly {
            cache: &cache,
            missed: false,
        };
        let _ = to_event(&stall(43), &items, &mut fast);
        assert!(fast.missed);
        // An OOM record the kernel attributed needs no map lookup; one it could not does.
        let oom = |from| {
            Record::Oom(agent_ebpf::OomEvent {
                header: agent_ebpf::Header {
                    cgroup_id: 42,
                    kind: agent_ebpf::KIND_OOM,
                    pid: 9,
                    ..Default::default()
                },
                cgroup_from: from,
                ..Default::default()
            })
        };
        let mut fast = CacheOnly {
            cache: &cache,
            missed: false,
        };
        let ev = to_event(&oom(agent_ebpf::OOM_CGROUP_FROM_RAW_TP), &items, &mut fast);
        assert!(!fast.missed);
        assert_eq!(ev.cgroup.as_deref(), Some("/kubepods/pod1"));
        let mut fast = CacheOnly {
            cache: &cache,
            missed: false,
        };
        let _ = to_event(&oom(agent_ebpf::OOM_CGROUP_OF_INVOKER), &items, &mut fast);
        assert!(fast.missed);
    }
}
