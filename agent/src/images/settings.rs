//! The image GC manager's settings and errors: the kubelet's image GC policy, the timing
//! the kubelet hard-codes (`imageGC.period`, `imageGC.listRefresh` in the agent's config), and
//! where the records are kept — validated before the manager starts.

use std::path::PathBuf;
use std::time::Duration;

use crate::act::cri::CriError;
use crate::config::Config;
use crate::decide::image_gc::ImageGcPolicy;

/// How the manager runs: the kubelet's image GC policy plus the timing the kubelet
/// hard-codes, and where the records are kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageGcSettings {
    /// Thresholds and ages (`imageGCHighThresholdPercent`, …).
    pub policy: ImageGcPolicy,
    /// Time between GC rounds (kubelet: 5 minutes). With a high threshold of 100 the rounds
    /// are off and only detection runs at this period.
    pub period: Duration,
    /// Time between refreshes of the cached image list (kubelet: 30 seconds).
    pub list_refresh: Duration,
    /// Where the records checkpoint lives; `None` keeps them in memory only.
    pub state_dir: Option<PathBuf>,
    /// The sandbox (pause) image reference; `None` asks the runtime's status for it.
    pub sandbox_image: Option<String>,
    /// Measure this path's filesystem instead of the runtime's `ImageFsInfo`.
    pub imagefs_path: Option<PathBuf>,
    /// `dryRun`: rounds and reclaims plan as always and delete nothing; their events list
    /// what they would have deleted.
    pub dry_run: bool,
}

fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

impl ImageGcSettings {
    /// The settings the config file asks for.
    pub fn from_config(config: &Config) -> ImageGcSettings {
        ImageGcSettings {
            policy: ImageGcPolicy {
                high_threshold_percent: i64::from(config.image_gc_high_threshold_percent),
                low_threshold_percent: i64::from(config.image_gc_low_threshold_percent),
                min_age_nanos: nanos(config.image_minimum_gc_age.0),
                max_age_nanos: nanos(config.image_maximum_gc_age.0),
            },
            period: config.image_gc.period.0,
            list_refresh: config.image_gc.list_refresh.0,
            state_dir: Some(config.state_dir.clone()),
            sandbox_image: Some(config.runtime.sandbox_image.clone()).filter(|s| !s.is_empty()),
            imagefs_path: Some(PathBuf::from(&config.node.imagefs_path))
                .filter(|p| !p.as_os_str().is_empty()),
            dry_run: config.dry_run,
        }
    }

    /// The kubelet's checks on the policy (its messages), and non-zero periods.
    pub fn validate(&self) -> Result<(), ImageGcError> {
        self.policy.validate().map_err(ImageGcError::Policy)?;
        for (what, value) in [("period", self.period), ("listRefresh", self.list_refresh)] {
            if value.is_zero() {
                return Err(ImageGcError::Setting {
                    what,
                    why: "must be greater than zero".into(),
                });
            }
        }
        Ok(())
    }

    /// Whether periodic rounds run: a high threshold of 100 is the kubelet's "image GC off"
    /// (the disk-pressure reclaim still runs).
    pub(crate) fn periodic_gc_enabled(&self) -> bool {
        self.policy.high_threshold_percent < 100
    }
}

/// Why the manager could not start, or a round could not run.
#[derive(Debug, thiserror::Error)]
pub enum ImageGcError {
    /// The policy is refused, with the kubelet's message.
    #[error("invalid image GC policy: {0}")]
    Policy(#[source] crate::decide::image_gc::PolicyError),
    /// A timing setting is refused.
    #[error("invalid image GC setting imageGC.{what}: {why}")]
    Setting {
        /// The setting.
        what: &'static str,
        /// Why.
        why: String,
    },
    /// The state directory cannot be created.
    #[error("image GC state directory {path}: {source}")]
    StateDir {
        /// The directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The runtime could not be asked (down, hung, or refused a listing).
    #[error("{0}")]
    Runtime(#[from] CriError),
    /// The runtime went away while the round was deleting images.
    #[error(
        "{source} (the round had deleted {deleted} image(s), {freed_bytes} bytes, before it stopped)"
    )]
    Interrupted {
        /// What the runtime said.
        source: CriError,
        /// Images deleted before it went.
        deleted: usize,
        /// Bytes they freed.
        freed_bytes: u64,
    },
    /// The image filesystem could not be measured.
    #[error("image filesystem: {0}")]
    ImageFs(String),
}

impl ImageGcError {
    /// Whether the runtime is down or hung (the round will work again once it is back).
    pub fn is_runtime_down(&self) -> bool {
        match self {
            ImageGcError::Runtime(e) | ImageGcError::Interrupted { source: e, .. } => {
                e.is_runtime_down()
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_from_config() {
        let mut c = Config {
            image_gc_high_threshold_percent: 100,
            ..Config::default()
        };
        c.runtime.sandbox_image = "localhost/pause:1".into();
        let s = ImageGcSettings::from_config(&c);
        assert_eq!(s.policy.min_age_nanos, 120_000_000_000);
        assert_eq!(s.period, Duration::from_secs(300));
        assert_eq!(s.list_refresh, Duration::from_secs(30));
        assert_eq!(s.sandbox_image.as_deref(), Some("localhost/pause:1"));
        assert_eq!(s.imagefs_path, None);
        assert_eq!(s.state_dir, Some(PathBuf::from("/var/lib/reactor")));
        assert!(!s.periodic_gc_enabled());
        assert!(s.validate().is_ok());
    }
}
