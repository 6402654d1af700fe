//! The CRI client: one lazily connected gRPC channel over the runtime's unix socket, every
//! call bounded by a timeout, every answer converted to domain types.
//!
//! The channel is lazy on purpose: the agent must start (and keep handling memory pressure
//! with what it has) while the runtime is down or restarting; each call then fails fast with
//! [`CriError::Unavailable`] and the channel reconnects on its own once the socket is back.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use reactor_proto::runtime_v1 as pb;
use reactor_proto::runtime_v1::image_service_client::ImageServiceClient;
use reactor_proto::runtime_v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::{Channel, Endpoint, Uri};

use super::convert;
use super::error::CriError;
use super::types::*;

/// How long the client waits for the runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Connecting to the socket (a local socket connects at once or not at all).
    pub connect: Duration,
    /// One call, start to answer. Stop calls get their grace period on top of this.
    pub request: Duration,
}

impl Default for Timeouts {
    /// 2 s to connect, 30 s per call: shorter than the kubelet's 2 min, since a pressure
    /// decision waiting on a hung runtime is worth less than one taken without it.
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(2),
            request: Duration::from_secs(30),
        }
    }
}

/// A CRI `runtime.v1` client (runtime and image services) for one runtime endpoint.
///
/// Cheap to clone: clones share one HTTP/2 connection.
#[derive(Debug, Clone)]
pub struct CriClient {
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
    timeouts: Timeouts,
    socket: PathBuf,
}

/// Parses `unix:///run/containerd/containerd.sock` (or a bare absolute path, as older kubelet
/// flags allowed) into the socket path.
fn socket_path(endpoint: &str) -> Result<PathBuf, CriError> {
    let bad = |why: &str| CriError::Endpoint {
        endpoint: endpoint.to_string(),
        why: why.to_string(),
    };
    let path = match endpoint.strip_prefix("unix://") {
        Some(rest) => rest,
        None if endpoint.starts_with('/') => endpoint,
        None if endpoint.contains("://") => {
            return Err(bad("only unix:// endpoints are supported"))
        }
        None => return Err(bad("expected unix:///path/to/socket")),
    };
    if !path.starts_with('/') {
        return Err(bad("the socket path must be absolute (unix:///path)"));
    }
    Ok(PathBuf::from(path))
}

impl CriClient {
    /// Creates a client for `endpoint` (`unix:///path/to/socket`). Nothing is dialled yet:
    /// the first call connects, so this succeeds while the runtime is down. Must be called
    /// inside a Tokio runtime (the channel's worker task is spawned here).
    pub async fn connect(endpoint: &str, timeouts: Timeouts) -> Result<CriClient, CriError> {
        let socket = socket_path(endpoint)?;
        let dial = socket.clone();
        // The URI is required by the HTTP/2 layer but never resolved: the connector below
        // ignores it and dials the socket.
        let channel = Endpoint::from_static("http://cri.invalid")
            .connect_timeout(timeouts.connect)
            .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                let dial = dial.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(dial).await?;
                    Ok::<_, std::io::Error>(TokioIo::new(stream))
                }
            }));
        Ok(CriClient {
            runtime: RuntimeServiceClient::new(channel.clone()),
            images: ImageServiceClient::new(channel),
            timeouts,
            socket,
        })
    }

    /// The socket this client dials.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Runs one RPC under `limit`. The limit is enforced here, not by tonic's endpoint
    /// timeout, so an expired call is always [`CriError::Timeout`] (tonic's own would race it
    /// and report `Cancelled`).
    async fn call<T>(
        &self,
        rpc: &'static str,
        limit: Duration,
        fut: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, CriError> {
        match tokio::time::timeout(limit, fut).await {
            Err(_) => Err(CriError::Timeout { rpc, after: limit }),
            Ok(Err(status)) => Err(CriError::from_status(rpc, &status)),
            Ok(Ok(resp)) => Ok(resp.into_inner()),
        }
    }

    /// The runtime's name and versions; also the cheapest "is it up?" probe.
    pub async fn version(&self) -> Result<RuntimeVersion, CriError> {
        let mut c = self.runtime.clone();
        let req = pb::VersionRequest {
            version: "v1".into(),
        };
        let r = self
            .call("Version", self.timeouts.request, c.version(req))
            .await?;
        Ok(RuntimeVersion {
            api_version: r.version,
            runtime_name: r.runtime_name,
            runtime_version: r.runtime_version,
            runtime_api_version: r.runtime_api_version,
        })
    }

    /// The runtime's conditions and, from its verbose info, its sandbox image.
    pub async fn status(&self) -> Result<RuntimeStatus, CriError> {
        let mut c = self.runtime.clone();
        let req = pb::StatusRequest { verbose: true };
        let r = self
            .call("Status", self.timeouts.request, c.status(req))
            .await?;
        let conditions = r
            .status
            .map(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .map(|c| RuntimeCondition {
                kind: c.r#type,
                status: c.status,
                reason: c.reason,
                message: c.message,
            })
            .collect();
        Ok(RuntimeStatus {
            conditions,
            sandbox_image: convert::sandbox_image(&r.info),
        })
    }

    /// The runtime's cgroup driver. Runtimes older than CRI's `RuntimeConfig` (containerd
    /// 1.6) answer [`CriError::Unimplemented`]; the caller then uses its configured driver.
    pub async fn cgroup_driver(&self) -> Result<CgroupDriver, CriError> {
        let mut c = self.runtime.clone();
        let r = self
            .call(
                "RuntimeConfig",
                self.timeouts.request,
                c.runtime_config(pb::RuntimeConfigRequest {}),
            )
            .await?;
        let linux = r.linux.ok_or(CriError::BadResponse {
            rpc: "RuntimeConfig",
            what: "no linux configuration".into(),
        })?;
        convert::cgroup_driver(linux.cgroup_driver).ok_or(CriError::BadResponse {
            rpc: "RuntimeConfig",
            what: format!("unknown cgroup driver {}", linux.cgroup_driver),
        })
    }

    /// Creates and starts a pod sandbox; returns its id.
    pub async fn run_pod_sandbox(&self, spec: &PodSandboxSpec) -> Result<String, CriError> {
        const RPC: &str = "RunPodSandbox";
        let req = pb::RunPodSandboxRequest {
            config: Some(convert::sandbox_config(RPC, spec)?),
            runtime_handler: String::new(),
        };
        let mut c = self.runtime.clone();
        let r = self
            .call(RPC, self.timeouts.request, c.run_pod_sandbox(req))
            .await?;
        if r.pod_sandbox_id.is_empty() {
            return Err(CriError::BadResponse {
                rpc: RPC,
                what: "empty pod sandbox id".into(),
            });
        }
        Ok(r.pod_sandbox_id)
    }

    /// Stops every process of a sandbox (its containers are killed). Idempotent in CRI.
    pub async fn stop_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let mut c = self.runtime.clone();
        let req = pb::StopPodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        self.call(
            "StopPodSandbox",
            self.timeouts.request,
            c.stop_pod_sandbox(req),
        )
        .await
        .map(drop)
    }

    /// Removes a stopped sandbox and its containers.
    pub async fn remove_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let mut c = self.runtime.clone();
        let req = pb::RemovePodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        self.call(
            "RemovePodSandbox",
            self.timeouts.request,
            c.remove_pod_sandbox(req),
        )
        .await
        .map(drop)
    }

    /// One sandbox's state (what the kubelet checks before reusing or removing a sandbox).
    pub async fn pod_sandbox_status(&self, id: &str) -> Result<SandboxInfo, CriError> {
        const RPC: &str = "PodSandboxStatus";
        let mut c = self.runtime.clone();
        let req = pb::PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose: false,
        };
        let r = self
            .call(RPC, self.timeouts.request, c.pod_sandbox_status(req))
            .await?;
        let status = r.status.ok_or(CriError::BadResponse {
            rpc: RPC,
            what: "no status".into(),
        })?;
        Ok(convert::sandbox_status(status))
    }

    /// Lists pod sandboxes matching `filter`.
    pub async fn list_pod_sandboxes(
        &self,
        filter: &SandboxFilter,
    ) -> Result<Vec<SandboxInfo>, CriError> {
        let mut c = self.runtime.clone();
        let req = pb::ListPodSandboxRequest {
            filter: Some(convert::sandbox_filter(filter)),
        };
        let r = self
            .call(
                "ListPodSandbox",
                self.timeouts.request,
                c.list_pod_sandbox(req),
            )
            .await?;
        Ok(r.items.into_iter().map(convert::sandbox).collect())
    }

    /// Creates a container in sandbox `sandbox_id`; `sandbox` must be the spec the sandbox
    /// was created with (CRI passes it again: containerd takes the cgroup parent and the log
    /// directory from it). Returns the container's id.
    pub async fn create_container(
        &self,
        sandbox_id: &str,
        spec: &ContainerSpec,
        sandbox: &PodSandboxSpec,
    ) -> Result<String, CriError> {
        const RPC: &str = "CreateContainer";
        let req = pb::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.into(),
            config: Some(convert::container_config(RPC, spec)?),
            sandbox_config: Some(convert::sandbox_config(RPC, sandbox)?),
        };
        let mut c = self.runtime.clone();
        let r = self
            .call(RPC, self.timeouts.request, c.create_container(req))
            .await?;
        if r.container_id.is_empty() {
            return Err(CriError::BadResponse {
                rpc: RPC,
                what: "empty container id".into(),
            });
        }
        Ok(r.container_id)
    }

    /// Starts a created container.
    pub async fn start_container(&self, id: &str) -> Result<(), CriError> {
        let mut c = self.runtime.clone();
        let req = pb::StartContainerRequest {
            container_id: id.into(),
        };
        self.call(
            "StartContainer",
            self.timeouts.request,
            c.start_container(req),
        )
        .await
        .map(drop)
    }

    /// Stops a container: its stop signal, then SIGKILL after `grace` (whole seconds, as CRI
    /// counts them; zero kills at once).
    pub async fn stop_container(&self, id: &str, grace: Duration) -> Result<(), CriError> {
        let mut c = self.runtime.clone();
        let secs = i64::try_from(grace.as_secs()).unwrap_or(i64::MAX);
        let req = pb::StopContainerRequest {
            container_id: id.into(),
            timeout: secs,
        };
        self.call(
            "StopContainer",
            self.timeouts.request.saturating_add(grace),
            c.stop_container(req),
        )
        .await
        .map(drop)
    }

    /// Changes a running container's cgroup settings in place (the kubelet's in-place pod
    /// resize); fields left `None` are left to the runtime's default.
    pub async fn update_container_resources(
        &self,
        id: &str,
        resources: &LinuxResources,
    ) -> Result<(), CriError> {
        const RPC: &str = "UpdateContainerResources";
        let req = pb::UpdateContainerResourcesRequest {
            container_id: id.into(),
            linux: Some(convert::resources(RPC, resources)?),
            ..Default::default()
        };
        let mut c = self.runtime.clone();
        self.call(
            RPC,
            self.timeouts.request,
            c.update_container_resources(req),
        )
        .await
        .map(drop)
    }

    /// Removes a container (stopping it first if it still runs).
    pub async fn remove_container(&self, id: &str) -> Result<(), CriError> {
        let mut c = self.runtime.clone();
        let req = pb::RemoveContainerRequest {
            container_id: id.into(),
        };
        self.call(
            "RemoveContainer",
            self.timeouts.request,
            c.remove_container(req),
        )
        .await
        .map(drop)
    }

    /// Lists containers matching `filter`; image GC takes the images in use from here.
    pub async fn list_containers(
        &self,
        filter: &ContainerFilter,
    ) -> Result<Vec<ContainerInfo>, CriError> {
        let mut c = self.runtime.clone();
        let req = pb::ListContainersRequest {
            filter: Some(convert::container_filter(filter)),
        };
        let r = self
            .call(
                "ListContainers",
                self.timeouts.request,
                c.list_containers(req),
            )
            .await?;
        Ok(r.containers.into_iter().map(convert::container).collect())
    }

    /// One container's status (exit code and reason once it exited).
    pub async fn container_status(&self, id: &str) -> Result<ContainerStatus, CriError> {
        const RPC: &str = "ContainerStatus";
        let mut c = self.runtime.clone();
        let req = pb::ContainerStatusRequest {
            container_id: id.into(),
            verbose: false,
        };
        let r = self
            .call(RPC, self.timeouts.request, c.container_status(req))
            .await?;
        let status = r.status.ok_or(CriError::BadResponse {
            rpc: RPC,
            what: "no status".into(),
        })?;
        Ok(convert::container_status(status))
    }

    /// The host pid of a running container's main process, from the runtime's verbose
    /// status (containerd puts it in `info["info"].pid`); `None` when the container is not
    /// running or the runtime does not reveal it. CRI has no field for it, but a node agent
    /// needs it to find the process in /proc (its `oom_score_adj`, its cgroup).
    pub(crate) async fn container_pid(&self, id: &str) -> Result<Option<u32>, CriError> {
        const RPC: &str = "ContainerStatus";
        let mut c = self.runtime.clone();
        let req = pb::ContainerStatusRequest {
            container_id: id.into(),
            verbose: true,
        };
        let r = self
            .call(RPC, self.timeouts.request, c.container_status(req))
            .await?;
        Ok(convert::container_pid(&r.info))
    }

    /// Resource use of one container.
    pub async fn container_stats(&self, id: &str) -> Result<ContainerStats, CriError> {
        const RPC: &str = "ContainerStats";
        let mut c = self.runtime.clone();
        let req = pb::ContainerStatsRequest {
            container_id: id.into(),
        };
        let r = self
            .call(RPC, self.timeouts.request, c.container_stats(req))
            .await?;
        let stats = r.stats.ok_or(CriError::BadResponse {
            rpc: RPC,
            what: "no stats".into(),
        })?;
        Ok(convert::container_stats(stats))
    }

    /// Resource use of every container matching `filter`.
    pub async fn list_container_stats(
        &self,
        filter: &StatsFilter,
    ) -> Result<Vec<ContainerStats>, CriError> {
        let mut c = self.runtime.clone();
        let req = pb::ListContainerStatsRequest {
            filter: Some(convert::stats_filter(filter)),
        };
        let r = self
            .call(
                "ListContainerStats",
                self.timeouts.request,
                c.list_container_stats(req),
            )
            .await?;
        Ok(r.stats.into_iter().map(convert::container_stats).collect())
    }

    /// Every image the runtime holds.
    pub async fn list_images(&self) -> Result<Vec<ImageInfo>, CriError> {
        let mut c = self.images.clone();
        let req = pb::ListImagesRequest { filter: None };
        let r = self
            .call("ListImages", self.timeouts.request, c.list_images(req))
            .await?;
        Ok(r.images.into_iter().map(convert::image).collect())
    }

    /// One image by reference (tag, digest or id); `None` if the runtime does not hold it.
    pub async fn image_status(&self, reference: &str) -> Result<Option<ImageInfo>, CriError> {
        let mut c = self.images.clone();
        let req = pb::ImageStatusRequest {
            image: Some(pb::ImageSpec {
                image: reference.into(),
                ..Default::default()
            }),
            verbose: false,
        };
        let r = self
            .call("ImageStatus", self.timeouts.request, c.image_status(req))
            .await?;
        Ok(r.image.map(convert::image))
    }

    /// Removes an image by reference (tag, digest or id). CRI makes removing an absent image
    /// a success.
    pub async fn remove_image(&self, reference: &str) -> Result<(), CriError> {
        let mut c = self.images.clone();
        let req = pb::RemoveImageRequest {
            image: Some(pb::ImageSpec {
                image: reference.into(),
                ..Default::default()
            }),
        };
        self.call("RemoveImage", self.timeouts.request, c.remove_image(req))
            .await
            .map(drop)
    }

    /// Usage of the filesystems holding images (and writable layers, where the runtime keeps
    /// them apart). CRI reports only what the runtime's data uses; capacity, available bytes
    /// and inode totals come from statvfs on the reported mount point, left `None` when that
    /// path is not visible from here.
    pub async fn image_fs_info(&self) -> Result<ImageFsInfo, CriError> {
        let mut c = self.images.clone();
        let r = self
            .call(
                "ImageFsInfo",
                self.timeouts.request,
                c.image_fs_info(pb::ImageFsInfoRequest {}),
            )
            .await?;
        let fill = |u: pb::FilesystemUsage| with_statvfs(convert::filesystem_usage(u));
        Ok(ImageFsInfo {
            image_filesystems: r.image_filesystems.into_iter().map(fill).collect(),
            container_filesystems: r.container_filesystems.into_iter().map(fill).collect(),
        })
    }
}

/// Adds the filesystem's size and free space from statvfs on its mount point.
fn with_statvfs(mut u: FilesystemUsage) -> FilesystemUsage {
    if u.mount_point.as_os_str().is_empty() {
        return u;
    }
    if let Ok(st) = rustix::fs::statvfs(&u.mount_point) {
        u.capacity_bytes = Some(st.f_blocks.saturating_mul(st.f_frsize));
        u.available_bytes = Some(st.f_bavail.saturating_mul(st.f_frsize));
        u.inodes_total = Some(st.f_files);
        u.inodes_free = Some(st.f_ffree);
    }
    u
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_must_be_absolute_unix_paths() {
        assert_eq!(
            socket_path("unix:///run/containerd/containerd.sock").unwrap(),
            PathBuf::from("/run/containerd/containerd.sock")
        );
        assert_eq!(
            socket_path("/run/crio/crio.sock").unwrap(),
            PathBuf::from("/run/crio/crio.sock")
        );
        for bad in ["tcp://1.2.3.4:5", "unix://relative.sock", "sock", ""] {
            let e = socket_path(bad).unwrap_err();
            assert!(matches!(e, CriError::Endpoint { .. }), "{bad}: {e}");
        }
    }

    #[test]
    fn statvfs_fills_capacity_for_a_visible_mount_point() {
        let u = with_statvfs(FilesystemUsage {
            timestamp_ns: 1,
            mount_point: std::env::temp_dir(),
            used_bytes: Some(1),
            inodes_used: None,
            capacity_bytes: None,
            available_bytes: None,
            inodes_total: None,
            inodes_free: None,
        });
        let cap = u.capacity_bytes.unwrap();
        assert!(cap > 0 && u.available_bytes.unwrap() <= cap);
        let missing = with_statvfs(FilesystemUsage {
            mount_point: "/nonexistent/reactor".into(),
            capacity_bytes: None,
            ..u.clone()
        });
        assert_eq!(missing.capacity_bytes, None);
    }

    #[tokio::test]
    async fn a_peer_that_never_answers_is_a_timeout_naming_the_rpc() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("silent.sock");
        // Accepts connections and never speaks: a hung runtime.
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let held = tokio::spawn(async move {
            let mut conns = Vec::new();
            while let Ok((c, _)) = listener.accept().await {
                conns.push(c);
            }
        });
        let timeouts = Timeouts {
            connect: Duration::from_secs(1),
            request: Duration::from_millis(300),
        };
        let client = CriClient::connect(&format!("unix://{}", path.display()), timeouts)
            .await
            .unwrap();
        let e = client.list_images().await.unwrap_err();
        assert_eq!(
            e,
            CriError::Timeout {
                rpc: "ListImages",
                after: Duration::from_millis(300)
            }
        );
        assert!(e.is_runtime_down());
        held.abort();
    }

    #[tokio::test]
    async fn a_missing_socket_is_unavailable_not_a_hang() {
        let dir = tempfile::tempdir().unwrap();
        let endpoint = format!("unix://{}/none.sock", dir.path().display());
        let client = CriClient::connect(&endpoint, Timeouts::default())
            .await
            .unwrap();
        let e = client.version().await.unwrap_err();
        assert!(e.is_runtime_down(), "{e}");
        assert_eq!(e.rpc(), Some("Version"));
    }
}
