//! The image records: what the agent remembers about each image the runtime holds, by image
//! id — when it was first detected, when a running container last used it, its size, and
//! whether the runtime pins it.
//!
//! Why a record at all: the runtime knows neither when an image arrived nor when it was last
//! used, yet the kubelet's policy turns on both (`imageMinimumGCAge` protects fresh pulls,
//! least recently used goes first). Everything here is pure bookkeeping over plain values
//! with time passed in, so the rules are unit-tested without a runtime; the manager feeds it
//! what CRI reports and checkpoints the result.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::act::cri::ImageInfo;
use crate::decide::image_gc::ImageRecord;
use crate::decide::timestamp::UnixNanos;

/// What the agent remembers about one image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// When the agent first saw the image; `None` is "some unknown time in the past" (the
    /// kubelet's zero time), given to images found by the very first detection of an agent
    /// that has no checkpoint, so they are not mistaken for fresh pulls.
    pub first_detected: Option<UnixNanos>,
    /// When a detection last found a running container (or the sandbox) using it; `None` is
    /// never.
    pub last_used: Option<UnixNanos>,
    /// Bytes the runtime reports for it.
    pub size_bytes: u64,
    /// The runtime asks that it never be garbage-collected.
    pub pinned: bool,
}

/// What one detection changed, so the caller knows whether to write the checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct DetectOutcome {
    /// Ids seen for the first time.
    pub added: Vec<String>,
    /// Ids no longer listed by the runtime, whose records were dropped.
    pub removed: Vec<String>,
    /// Whether any record changed at all (new, gone, used, resized, pinned).
    pub changed: bool,
}

/// The image records, keyed by image id. Iteration is in id order, which makes the plan's
/// tie-breaking (equal last-used and first-detected times) reproducible.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageRecords {
    records: BTreeMap<String, Record>,
}

/// The ids of the images in use: those the running containers resolve to, plus the sandbox
/// image. A container's reference is matched against image ids first (containerd 1.6 puts
/// the id in `image_ref`), then against tags and digests (newer runtimes may report a repo
/// digest); a reference that matches no listed image is kept as given, which is harmless.
pub(crate) fn images_in_use<'a>(
    images: &[ImageInfo],
    running_refs: impl IntoIterator<Item = &'a str>,
    sandbox_image_id: Option<&str>,
) -> BTreeSet<String> {
    let resolve = |reference: &str| -> String {
        images
            .iter()
            .find(|i| i.id == reference)
            .or_else(|| {
                images.iter().find(|i| {
                    i.repo_digests.iter().any(|d| d == reference)
                        || i.repo_tags.iter().any(|t| t == reference)
                })
            })
            .map_or_else(|| reference.to_string(), |i| i.id.clone())
    };
    running_refs
        .into_iter()
        .filter(|r| !r.is_empty())
        .map(resolve)
        .chain(sandbox_image_id.map(str::to_string))
        .collect()
}

impl ImageRecords {
    /// No records.
    pub fn new() -> ImageRecords {
        ImageRecords::default()
    }

    /// The kubelet's `detectImages`: every listed image gets a record (a new one is detected
    /// at `detected_at`), images in use are marked used at `now`, sizes and pins follow the
    /// runtime, and records of images the runtime no longer lists are dropped.
    pub(crate) fn detect(
        &mut self,
        images: &[ImageInfo],
        in_use: &BTreeSet<String>,
        detected_at: Option<UnixNanos>,
        now: UnixNanos,
    ) -> DetectOutcome {
        let mut out = DetectOutcome::default();
        let listed: BTreeSet<&str> = images.iter().map(|i| i.id.as_str()).collect();
        for image in images {
            let record = self.records.entry(image.id.clone()).or_insert_with(|| {
                out.added.push(image.id.clone());
                Record {
                    first_detected: detected_at,
                    last_used: None,
                    size_bytes: image.size_bytes,
                    pinned: image.pinned,
                }
            });
            let before = record.clone();
            if in_use.contains(&image.id) {
                record.last_used = Some(now);
            }
            record.size_bytes = image.size_bytes;
            record.pinned = image.pinned;
            out.changed |= *record != before;
        }
        let gone: Vec<String> = self
            .records
            .keys()
            .filter(|id| !listed.contains(id.as_str()))
            .cloned()
            .collect();
        for id in &gone {
            self.records.remove(id);
        }
        out.removed = gone;
        out.changed |= !out.added.is_empty() || !out.removed.is_empty();
        out
    }

    /// The records as the decide layer's plan input, in id order, with `in_use` marking the
    /// images running containers and the sandbox hold.
    pub(crate) fn plan_input(&self, in_use: &BTreeSet<String>) -> Vec<ImageRecord> {
        self.records
            .iter()
            .map(|(id, r)| ImageRecord {
                id: id.clone(),
                size_bytes: i64::try_from(r.size_bytes).unwrap_or(i64::MAX),
                first_detected: r.first_detected,
                last_used: r.last_used,
                in_use: in_use.contains(id),
                pinned: r.pinned,
            })
            .collect()
    }

    /// Drops the record of a deleted image; returns it.
    pub(crate) fn remove(&mut self, id: &str) -> Option<Record> {
        self.records.remove(id)
    }

    /// One image's record.
    pub fn get(&self, id: &str) -> Option<&Record> {
        self.records.get(id)
    }

    /// Every record, in id order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Record)> {
        self.records.iter()
    }

    /// How many images have records.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether there are no records.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The checkpoint form.
    pub fn to_stored(&self) -> StoredRecords {
        StoredRecords {
            images: self
                .records
                .iter()
                .map(|(id, r)| {
                    (
                        id.clone(),
                        StoredRecord {
                            first_detected_ns: r.first_detected.map(clamp_i64),
                            last_used_ns: r.last_used.map(clamp_i64),
                            size_bytes: r.size_bytes,
                            pinned: r.pinned,
                        },
                    )
                })
                .collect(),
        }
    }

    /// Records from their checkpoint form.
    pub fn from_stored(stored: StoredRecords) -> ImageRecords {
        ImageRecords {
            records: stored
                .images
                .into_iter()
                .map(|(id, s)| {
                    (
                        id,
                        Record {
                            first_detected: s.first_detected_ns.map(i128::from),
                            last_used: s.last_used_ns.map(i128::from),
                            size_bytes: s.size_bytes,
                            pinned: s.pinned,
                        },
                    )
                })
                .collect(),
        }
    }
}

fn clamp_i64(t: UnixNanos) -> i64 {
    i64::try_from(t).unwrap_or(if t < 0 { i64::MIN } else { i64::MAX })
}

/// The image records as checkpointed (`image-records` version 1): times as Unix nanoseconds
/// in 64 bits (good until 2262), absent for "unknown past" / "never".
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StoredRecords {
    /// Records by image id.
    pub images: BTreeMap<String, StoredRecord>,
}

/// One record as checkpointed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StoredRecord {
    /// First detection, Unix nanoseconds.
    #[serde(default)]
    pub first_detected_ns: Option<i64>,
    /// Last use, Unix nanoseconds.
    #[serde(default)]
    pub last_used_ns: Option<i64>,
    /// Size in bytes.
    pub size_bytes: u64,
    /// Pinned by the runtime.
    #[serde(default)]
    pub pinned: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i128 = 1_000_000_000;

    fn img(id: &str, size: u64) -> ImageInfo {
        ImageInfo {
            id: id.to_string(),
            repo_tags: vec![format!("localhost/{id}:1")],
            repo_digests: vec![format!("localhost/{id}@sha256:d{id}")],
            size_bytes: size,
            pinned: false,
        }
    }

    #[test]
    fn first_detection_keeps_its_time_and_use_moves_last_used() {
        let mut r = ImageRecords::new();
        let images = [img("a", 10), img("b", 20)];
        let out = r.detect(&images, &BTreeSet::new(), None, 100 * S);
        assert_eq!(out.added, ["a", "b"]);
        assert!(out.changed);
        assert_eq!(r.get("a").unwrap().first_detected, None);

        // A later detection: a new image gets the detection time, old ones keep theirs.
        let images = [img("a", 10), img("b", 20), img("c", 30)];
        let in_use = BTreeSet::from(["b".to_string()]);
        let out = r.detect(&images, &in_use, Some(200 * S), 200 * S);
        assert_eq!(out.added, ["c"]);
        assert_eq!(r.get("a").unwrap().first_detected, None);
        assert_eq!(r.get("c").unwrap().first_detected, Some(200 * S));
        assert_eq!(r.get("b").unwrap().last_used, Some(200 * S));
        assert_eq!(r.get("a").unwrap().last_used, None);

        // Unchanged listing, nothing in use: nothing to save.
        let out = r.detect(&images, &BTreeSet::new(), Some(300 * S), 300 * S);
        assert_eq!(out, DetectOutcome::default());
        // Last use stays at the last detection that saw the image in use.
        assert_eq!(r.get("b").unwrap().last_used, Some(200 * S));
    }

    #[test]
    fn gone_images_are_dropped_and_size_and_pin_follow_the_runtime() {
        let mut r = ImageRecords::new();
        r.detect(&[img("a", 1), img("b", 2)], &BTreeSet::new(), None, S);
        let mut b = img("b", 5);
        b.pinned = true;
        let out = r.detect(&[b], &BTreeSet::new(), Some(2 * S), 2 * S);
        assert_eq!(out.removed, ["a"]);
        assert!(out.changed);
        assert_eq!(r.len(), 1);
        let rec = r.get("b").unwrap();
        assert_eq!((rec.size_bytes, rec.pinned), (5, true));
    }

    #[test]
    fn in_use_resolves_ids_tags_and_digests_and_adds_the_sandbox() {
        let images = [img("a", 1), img("b", 1), img("c", 1), img("p", 1)];
        let used = images_in_use(
            &images,
            [
                "a",
                "localhost/b:1",
                "localhost/c@sha256:dc",
                "",
                "elsewhere",
            ],
            Some("p"),
        );
        let want: BTreeSet<String> = ["a", "b", "c", "p", "elsewhere"]
            .into_iter()
            .map(String::from)
            .collect();
        assert_eq!(used, want);
    }

    #[test]
    fn plan_input_marks_in_use_and_keeps_pins() {
        let mut r = ImageRecords::new();
        let mut p = img("p", 3);
        p.pinned = true;
        r.detect(&[img("b", 2), img("a", 1), p], &BTreeSet::new(), None, S);
        let input = r.plan_input(&BTreeSet::from(["b".to_string()]));
        let view: Vec<(&str, bool, bool)> = input
            .iter()
            .map(|i| (i.id.as_str(), i.in_use, i.pinned))
            .collect();
        assert_eq!(
            view,
            [("a", false, false), ("b", true, false), ("p", false, true)]
        );
    }

    #[test]
    fn stored_form_round_trips_through_json() {
        let mut r = ImageRecords::new();
        r.detect(&[img("a", 1)], &BTreeSet::new(), None, S);
        r.detect(
            &[img("a", 1), img("b", 2)],
            &BTreeSet::from(["a".to_string()]),
            Some(7 * S),
            9 * S,
        );
        let json = serde_json::to_value(r.to_stored()).unwrap();
        assert_eq!(json["images"]["b"]["firstDetectedNs"], 7_000_000_000i64);
        assert!(json["images"]["a"]["firstDetectedNs"].is_null());
        let back: StoredRecords = serde_json::from_value(json).unwrap();
        assert_eq!(ImageRecords::from_stored(back), r);
    }
}
