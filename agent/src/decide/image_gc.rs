//! Image garbage collection: which unused images to delete, and in what order, by the
//! kubelet's image GC policy.
//!
//! Operators tune `imageGCHighThresholdPercent`, `imageGCLowThresholdPercent`,
//! `imageMinimumGCAge` and `imageMaximumGCAge` expecting the kubelet's behaviour: nothing
//! happens below the high threshold; at or above it, unused images are deleted least recently
//! used first until usage is back at the low threshold; images unused for longer than a
//! non-zero maximum age go whatever the usage, once the agent has been up that long. The plan
//! is computed over plain image records so the live collector and `reactor plan image-gc`
//! share it.

use crate::decide::timestamp::UnixNanos;

/// The image GC policy (the KubeletConfiguration's image GC settings).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageGcPolicy {
    /// Usage (percent of the image filesystem) at or above which space-driven GC runs.
    pub high_threshold_percent: i64,
    /// Usage space-driven GC frees down to.
    pub low_threshold_percent: i64,
    /// An image first seen less than this long ago is kept from space-driven deletion.
    pub min_age_nanos: i64,
    /// An unused image older than this is deleted whatever the usage; zero turns it off.
    pub max_age_nanos: i64,
}

impl ImageGcPolicy {
    /// The kubelet's checks when it builds its image GC manager, with its messages.
    pub fn validate(&self) -> Result<(), PolicyError> {
        let (high, low) = (self.high_threshold_percent, self.low_threshold_percent);
        if !(0..=100).contains(&high) {
            return Err(PolicyError::High(high));
        }
        if !(0..=100).contains(&low) {
            return Err(PolicyError::Low(low));
        }
        if low > high {
            return Err(PolicyError::LowAboveHigh { low, high });
        }
        if self.min_age_nanos < 0 {
            return Err(PolicyError::NegativeMinAge);
        }
        if self.max_age_nanos < 0 {
            return Err(PolicyError::NegativeMaxAge);
        }
        Ok(())
    }
}

/// A policy the kubelet refuses, with its message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// The high threshold is not a percentage.
    #[error("invalid HighThresholdPercent {0}, must be in range [0-100]")]
    High(i64),
    /// The low threshold is not a percentage.
    #[error("invalid LowThresholdPercent {0}, must be in range [0-100]")]
    Low(i64),
    /// The low threshold is above the high one.
    #[error("LowThresholdPercent {low} can not be higher than HighThresholdPercent {high}")]
    LowAboveHigh {
        /// The low threshold.
        low: i64,
        /// The high threshold.
        high: i64,
    },
    /// A negative minimum age.
    #[error("invalid MinAge: must not be negative")]
    NegativeMinAge,
    /// A negative maximum age.
    #[error("invalid MaxAge: must not be negative")]
    NegativeMaxAge,
}

/// What the agent knows about one image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRecord {
    /// The image id (`sha256:…`).
    pub id: String,
    /// Bytes the image takes on the image filesystem.
    pub size_bytes: i64,
    /// When the agent first saw the image; `None` is the beginning of time.
    pub first_detected: Option<UnixNanos>,
    /// When a container last used it; `None` is never (sorts before any use).
    pub last_used: Option<UnixNanos>,
    /// A running container uses it.
    pub in_use: bool,
    /// The runtime pins it (the sandbox image, for one).
    pub pinned: bool,
}

/// The image filesystem before anything is deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageFs {
    /// Total bytes.
    pub capacity_bytes: i64,
    /// Free bytes.
    pub available_bytes: i64,
}

/// Why an image is deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeleteReason {
    /// Unused for longer than the maximum age.
    Age,
    /// Needed to bring usage down to the low threshold.
    Space,
}

/// The outcome of one GC round.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageGcPlan {
    /// `100 - floor(available * 100 / capacity)`; `None` when the capacity is zero.
    pub usage_percent: Option<i64>,
    /// What space-driven GC aims to free; `None` below the high threshold.
    pub bytes_to_free: Option<i64>,
    /// Images to delete (indices into the input), in deletion order, with the reason.
    pub delete: Vec<(usize, DeleteReason)>,
    /// Bytes the deletions free.
    pub freed_bytes: i64,
    /// The policy is invalid, or the round cannot do what the policy asks (the kubelet's
    /// message); deletions listed are still made.
    pub error: Option<String>,
}

/// Indices of the images GC may consider (not in use, not pinned), least recently used
/// first, ties broken by first detection; remaining ties keep the input order.
pub(crate) fn images_in_eviction_order(images: &[ImageRecord]) -> Vec<usize> {
    // `None` is the beginning of time: below any real timestamp.
    let at = |t: Option<UnixNanos>| t.unwrap_or(UnixNanos::MIN);
    let mut keyed: Vec<(UnixNanos, UnixNanos, usize)> = images
        .iter()
        .enumerate()
        .filter(|(_, img)| !img.in_use && !img.pinned)
        .map(|(i, img)| (at(img.last_used), at(img.first_detected), i))
        .collect();
    keyed.sort_unstable();
    keyed.into_iter().map(|(_, _, i)| i).collect()
}

/// How long ago `then` was at `now`; `None` (the beginning of time) is infinitely long ago.
fn age(now: UnixNanos, then: Option<UnixNanos>) -> UnixNanos {
    then.map_or(UnixNanos::MAX, |t| now - t)
}

/// Plans one GC round at `now` as the kubelet's `GarbageCollect` would: age-driven deletion
/// first (only once the agent, started at `started_at`, has been up longer than the maximum
/// age), then space-driven deletion if usage is at or above the high threshold.
pub fn plan(
    policy: &ImageGcPolicy,
    fs: ImageFs,
    images: &[ImageRecord],
    now: UnixNanos,
    started_at: Option<UnixNanos>,
) -> ImageGcPlan {
    let mut out = ImageGcPlan::default();
    let capacity = fs.capacity_bytes;
    // The kubelet clamps an available figure above capacity.
    let available = fs.available_bytes.min(capacity);
    if capacity > 0 {
        out.usage_percent = Some(usage_percent(capacity, available));
    }
    if let Err(e) = policy.validate() {
        out.error = Some(e.to_string());
        return out;
    }
    // A high threshold of 100 with no maximum age is the kubelet's "image GC off".
    if policy.high_threshold_percent == 100 && policy.max_age_nanos == 0 {
        return out;
    }

    let order = images_in_eviction_order(images);
    let max_age = i128::from(policy.max_age_nanos);
    let age_gc_runs = max_age > 0 && age(now, started_at) > max_age;
    let mut remaining = Vec::with_capacity(order.len());
    for i in order {
        if age_gc_runs && age(now, images[i].last_used) > max_age {
            out.delete.push((i, DeleteReason::Age));
            out.freed_bytes = out.freed_bytes.saturating_add(images[i].size_bytes);
        } else {
            remaining.push(i);
        }
    }

    if capacity == 0 {
        out.error = Some("invalid capacity 0 on image filesystem".to_string());
        return out;
    }
    let usage = usage_percent(capacity, available);
    if usage < policy.high_threshold_percent {
        return out;
    }
    let amount_to_free = bytes_to_free(capacity, available, policy.low_threshold_percent);
    out.bytes_to_free = Some(amount_to_free);
    let min_age = i128::from(policy.min_age_nanos);
    let mut freed: i64 = 0;
    for i in remaining {
        let image = &images[i];
        if image.last_used.is_some_and(|used| used >= now) {
            continue;
        }
        if age(now, image.first_detected) < min_age {
            continue;
        }
        out.delete.push((i, DeleteReason::Space));
        freed = freed.saturating_add(image.size_bytes);
        if freed >= amount_to_free {
            break;
        }
    }
    out.freed_bytes = out.freed_bytes.saturating_add(freed);
    if freed < amount_to_free {
        out.error = Some(format!(
            "Failed to garbage collect required amount of images. Attempted to free {amount_to_free} bytes, but only found {freed} bytes eligible to free."
        ));
    }
    out
}

/// Usage of the image filesystem in whole percent, rounded up as the kubelet rounds it.
pub fn usage_percent(capacity: i64, available: i64) -> i64 {
    let capacity = i128::from(capacity);
    let available = i128::from(available);
    (100 - available * 100 / capacity) as i64
}

/// What brings usage down to the low threshold, computed in the kubelet's integer order
/// (negative when the filesystem is already there).
pub fn bytes_to_free(capacity: i64, available: i64, low_threshold_percent: i64) -> i64 {
    let target = i128::from(capacity) * i128::from(100 - low_threshold_percent) / 100;
    (target - i128::from(available)) as i64
}

/// Plans the disk-pressure reclaim (the kubelet's `DeleteUnusedImages`): every unused image
/// space-driven GC may delete, whatever the thresholds — a high threshold of 100 turns off the
/// periodic GC, not this — still keeping images in use, pinned, used at `now` or first seen
/// less than the minimum age ago. Least recently used first, as [`plan`] orders them.
pub(crate) fn plan_reclaim(
    policy: &ImageGcPolicy,
    images: &[ImageRecord],
    now: UnixNanos,
) -> ImageGcPlan {
    let mut out = ImageGcPlan::default();
    if let Err(e) = policy.validate() {
        out.error = Some(e.to_string());
        return out;
    }
    let min_age = i128::from(policy.min_age_nanos);
    for i in images_in_eviction_order(images) {
        let image = &images[i];
        if image.last_used.is_some_and(|used| used >= now) {
            continue;
        }
        if age(now, image.first_detected) < min_age {
            continue;
        }
        out.delete.push((i, DeleteReason::Space));
        out.freed_bytes = out.freed_bytes.saturating_add(image.size_bytes);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i128 = 1_000_000_000;
    const NOW: i128 = 1_000_000 * S;

    fn policy() -> ImageGcPolicy {
        ImageGcPolicy {
            high_threshold_percent: 85,
            low_threshold_percent: 80,
            min_age_nanos: 120_000_000_000,
            max_age_nanos: 0,
        }
    }

    fn image(id: &str, size: i64, first: Option<i128>, used: Option<i128>) -> ImageRecord {
        ImageRecord {
            id: id.to_string(),
            size_bytes: size,
            first_detected: first,
            last_used: used,
            in_use: false,
            pinned: false,
        }
    }

    fn ids(images: &[ImageRecord], plan: &ImageGcPlan) -> Vec<String> {
        plan.delete
            .iter()
            .map(|(i, _)| images[*i].id.clone())
            .collect()
    }

    #[test]
    fn below_high_threshold_nothing_happens() {
        let images = [image("a", 10, None, None)];
        let fs = ImageFs {
            capacity_bytes: 1000,
            available_bytes: 151,
        };
        let p = plan(&policy(), fs, &images, NOW, None);
        assert_eq!(p.usage_percent, Some(85)); // 100 - floor(15.1)
        assert_eq!(p.bytes_to_free, Some(200 - 151));
        let fs = ImageFs {
            capacity_bytes: 1000,
            available_bytes: 160,
        };
        let p = plan(&policy(), fs, &images, NOW, None);
        assert_eq!(p.usage_percent, Some(84));
        assert_eq!(p.bytes_to_free, None);
        assert!(p.delete.is_empty());
        assert_eq!(p.error, None);
    }

    #[test]
    fn lru_then_first_detected_keeping_in_use_pinned_young_and_current() {
        let mut images = vec![
            image(
                "used-recently",
                100,
                Some(NOW - 1000 * S),
                Some(NOW - 10 * S),
            ),
            image("never-used-late", 100, Some(NOW - 500 * S), None),
            image("never-used-early", 100, Some(NOW - 900 * S), None),
            image("young", 100, Some(NOW - 60 * S), None),
            image("in-use", 100, None, None),
            image("pinned", 100, None, None),
            image("used-now", 100, None, Some(NOW)),
            image("used-long-ago", 100, None, Some(NOW - 5000 * S)),
        ];
        images[4].in_use = true;
        images[5].pinned = true;
        let fs = ImageFs {
            capacity_bytes: 10_000,
            available_bytes: 0,
        };
        let p = plan(&policy(), fs, &images, NOW, None);
        assert_eq!(p.usage_percent, Some(100));
        assert_eq!(p.bytes_to_free, Some(2000));
        assert_eq!(
            ids(&images, &p),
            [
                "never-used-early",
                "never-used-late",
                "used-long-ago",
                "used-recently"
            ]
        );
        assert_eq!(p.freed_bytes, 400);
        assert!(p
            .error
            .as_deref()
            .unwrap()
            .contains("Attempted to free 2000 bytes, but only found 400 bytes"));
    }

    #[test]
    fn stops_once_enough_is_freed() {
        let images = [
            image("a", 30, None, Some(NOW - 300 * S)),
            image("b", 30, None, Some(NOW - 200 * S)),
            image("c", 30, None, Some(NOW - 100 * S)),
        ];
        let fs = ImageFs {
            capacity_bytes: 1000,
            available_bytes: 150,
        };
        let p = plan(&policy(), fs, &images, NOW, None);
        assert_eq!(p.bytes_to_free, Some(50));
        assert_eq!(ids(&images, &p), ["a", "b"]);
        assert_eq!(p.freed_bytes, 60);
        assert_eq!(p.error, None);
    }

    #[test]
    fn non_positive_amount_still_deletes_one_image() {
        // 85% used with low = high = 85: the kubelet's target is already met, yet its loop
        // deletes the first eligible image before checking.
        let pol = ImageGcPolicy {
            low_threshold_percent: 85,
            ..policy()
        };
        let images = [image("a", 10, None, None), image("b", 10, None, None)];
        let fs = ImageFs {
            capacity_bytes: 1000,
            available_bytes: 150,
        };
        let p = plan(&pol, fs, &images, NOW, None);
        assert_eq!(p.bytes_to_free, Some(0));
        assert_eq!(ids(&images, &p), ["a"]);
    }

    #[test]
    fn max_age_deletes_whatever_usage_and_min_age_once_up_long_enough() {
        let pol = ImageGcPolicy {
            max_age_nanos: 3600 * 1_000_000_000,
            ..policy()
        };
        let images = [
            image("stale", 7, Some(NOW - 10 * S), Some(NOW - 7200 * S)),
            image("fresh", 5, None, Some(NOW - 60 * S)),
            image("never", 3, Some(NOW - 30 * S), None),
        ];
        let fs = ImageFs {
            capacity_bytes: 1000,
            available_bytes: 900,
        };
        let p = plan(&pol, fs, &images, NOW, None);
        assert_eq!(ids(&images, &p), ["never", "stale"]);
        assert!(p.delete.iter().all(|(_, r)| *r == DeleteReason::Age));
        assert_eq!(p.freed_bytes, 10);
        assert_eq!(p.bytes_to_free, None);
        // Up for exactly the max age: not yet.
        let p = plan(&pol, fs, &images, NOW, Some(NOW - 3600 * S));
        assert!(p.delete.is_empty());
        let p = plan(&pol, fs, &images, NOW, Some(NOW - 3601 * S));
        assert_eq!(p.delete.len(), 2);
    }

    #[test]
    fn invalid_policy_and_capacity_are_errors_not_crashes() {
        let images = [image("a", 10, None, None)];
        let fs = ImageFs {
            capacity_bytes: 1000,
            available_bytes: 0,
        };
        for (high, low, needle) in [
            (101, 80, "HighThresholdPercent 101"),
            (85, -1, "LowThresholdPercent -1"),
            (80, 85, "can not be higher"),
        ] {
            let pol = ImageGcPolicy {
                high_threshold_percent: high,
                low_threshold_percent: low,
                ..policy()
            };
            let p = plan(&pol, fs, &images, NOW, None);
            assert!(p.error.as_deref().unwrap().contains(needle));
            assert!(p.delete.is_empty());
        }
        let p = plan(
            &policy(),
            ImageFs {
                capacity_bytes: 0,
                available_bytes: 0,
            },
            &images,
            NOW,
            None,
        );
        assert_eq!(p.usage_percent, None);
        assert!(p.error.unwrap().contains("invalid capacity 0"));
    }

    #[test]
    fn high_100_without_max_age_is_off_and_available_is_clamped() {
        let pol = ImageGcPolicy {
            high_threshold_percent: 100,
            low_threshold_percent: 90,
            ..policy()
        };
        let images = [image("a", 10, None, None)];
        let fs = ImageFs {
            capacity_bytes: 1000,
            available_bytes: 0,
        };
        let p = plan(&pol, fs, &images, NOW, None);
        assert!(p.delete.is_empty());
        assert_eq!(p.bytes_to_free, None);
        let fs = ImageFs {
            capacity_bytes: 1000,
            available_bytes: 5000,
        };
        assert_eq!(
            plan(&policy(), fs, &images, NOW, None).usage_percent,
            Some(0)
        );
    }

    #[test]
    fn ties_keep_input_order() {
        let images = [
            image("x", 1, Some(NOW - 500 * S), Some(NOW - 100 * S)),
            image("y", 1, Some(NOW - 500 * S), Some(NOW - 100 * S)),
            image("z", 1, Some(NOW - 600 * S), Some(NOW - 100 * S)),
        ];
        assert_eq!(images_in_eviction_order(&images), [2, 0, 1]);
    }

    mod invariants {
        use super::*;
        use proptest::prelude::*;

        fn record() -> impl Strategy<Value = ImageRecord> {
            (
                0i64..1000,
                prop::option::of(-5000i128..100),
                prop::option::of(-5000i128..100),
                any::<bool>(),
                any::<bool>(),
            )
                .prop_map(|(size, first, used, in_use, pinned)| ImageRecord {
                    id: String::new(),
                    size_bytes: size,
                    first_detected: first.map(|t| NOW + t * S),
                    last_used: used.map(|t| NOW + t * S),
                    in_use,
                    pinned,
                })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(128))]

            #[test]
            fn plans_respect_the_policy(
                images in prop::collection::vec(record(), 0..30),
                capacity in 0i64..20_000,
                available in 0i64..20_000,
                high in 0i64..=100,
                low in 0i64..=100,
                min_age in 0i64..3000,
                max_age in prop_oneof![Just(0i64), 1i64..6000],
                up in prop::option::of(0i128..10_000),
            ) {
                let policy = ImageGcPolicy {
                    high_threshold_percent: high,
                    low_threshold_percent: low,
                    min_age_nanos: min_age * 1_000_000_000,
                    max_age_nanos: max_age * 1_000_000_000,
                };
                let fs = ImageFs { capacity_bytes: capacity, available_bytes: available };
                let p = plan(&policy, fs, &images, NOW, up.map(|u| NOW - u * S));
                if low > high {
                    prop_assert!(p.error.is_some());
                    prop_assert!(p.delete.is_empty());
                }
                let mut seen = std::collections::HashSet::new();
                let mut freed = 0i64;
                for &(i, reason) in &p.delete {
                    let img = &images[i];
                    prop_assert!(seen.insert(i), "deleted twice");
                    prop_assert!(!img.in_use && !img.pinned);
                    freed += img.size_bytes;
                    if reason == DeleteReason::Space {
                        prop_assert!(img.last_used.is_none_or(|u| u < NOW));
                        prop_assert!(img.first_detected.is_none_or(|f| NOW - f >= i128::from(policy.min_age_nanos)));
                    } else {
                        prop_assert!(max_age > 0);
                    }
                }
                prop_assert_eq!(freed, p.freed_bytes);
                if let Some(target) = p.bytes_to_free {
                    let space: i64 = p.delete.iter().filter(|(_, r)| *r == DeleteReason::Space)
                        .map(|(i, _)| images[*i].size_bytes).sum();
                    prop_assert_eq!(space < target, p.error.is_some());
                }
            }
        }
    }

    #[test]
    fn reclaim_ignores_thresholds_but_keeps_young_used_and_pinned() {
        let pol = ImageGcPolicy {
            high_threshold_percent: 100,
            low_threshold_percent: 100,
            ..policy()
        };
        let mut images = vec![
            image("old", 10, None, Some(NOW - 500 * S)),
            image("never", 20, Some(NOW - 900 * S), None),
            image("young", 30, Some(NOW - 10 * S), None),
            image("now", 40, None, Some(NOW)),
            image("pinned", 50, None, None),
        ];
        images[4].pinned = true;
        let p = plan_reclaim(&pol, &images, NOW);
        assert_eq!(ids(&images, &p), ["never", "old"]);
        assert_eq!(p.freed_bytes, 30);
        assert_eq!(p.error, None);
        let bad = ImageGcPolicy {
            low_threshold_percent: 101,
            ..pol
        };
        assert!(plan_reclaim(&bad, &images, NOW).error.is_some());
    }
}
