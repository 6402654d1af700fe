//! `sample-device-plugin`: a small but real Kubernetes device plugin (API `v1beta1`) for
//! tests, demos and trying the agent's device manager without hardware.
//!
//! It advertises `--count` devices `dev-0`, `dev-1`, … under `--resource`, serves the
//! DevicePlugin service on its own socket in `--dir`, registers with `<dir>/kubelet.sock`,
//! and registers again whenever that socket is re-created (a restarted agent or kubelet).
//! `Allocate` answers with `SAMPLE_DEVICES=<ids>` and `SAMPLE_RESOURCE=<resource>`, one
//! device node per device and an annotation. With `--preferred` it implements
//! `GetPreferredAllocation` (preferring the highest-numbered free devices, so its choice is
//! visible); with `--pre-start` it asks for `PreStartContainer`. `--journal FILE` appends one
//! line per call it serves (`allocate dev-0,dev-1`, `prestart dev-3`, `preferred dev-3`). `--allocate-delay-ms N` holds every `Allocate` for N ms
//! after journaling `allocating <ids>` (a test knob: the fault-injection suite kills the plugin
//! there).
//!
//! Health is flipped by lines on stdin: `unhealthy dev-1` or `healthy dev-1`. A refused
//! registration prints the agent's reason on stderr and exits 1, as plugins are expected to.

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use reactor_proto::deviceplugin_v1beta1 as api;
use tokio::io::AsyncBufReadExt as _;
use tokio::sync::watch;
use tokio_stream::{Stream, StreamExt as _};
use tonic::{Request, Response, Status};

#[derive(Parser, Debug)]
#[command(about = "A sample Kubernetes device plugin (v1beta1) advertising fake devices")]
struct Args {
    /// Directory with the agent's (or kubelet's) `kubelet.sock`; this plugin's socket goes there too.
    #[arg(long)]
    dir: PathBuf,
    /// Extended resource name to advertise.
    #[arg(long, default_value = "vendor.example/dev")]
    resource: String,
    /// Number of devices (`dev-0` … `dev-<count-1>`).
    #[arg(long, default_value_t = 4)]
    count: u32,
    /// File name of this plugin's socket in `--dir` (default `sample-<pid>.sock`).
    #[arg(long)]
    socket: Option<String>,
    /// API version to register with (only to test refusals).
    #[arg(long, default_value = "v1beta1")]
    api_version: String,
    /// Offer GetPreferredAllocation.
    #[arg(long)]
    preferred: bool,
    /// Ask for PreStartContainer before each container start.
    #[arg(long)]
    pre_start: bool,
    /// Append a line per served call to this file.
    #[arg(long)]
    journal: Option<PathBuf>,
    /// NUMA node to report for every device (default: no topology).
    #[arg(long)]
    numa: Option<i64>,
    /// Milliseconds to wait inside each `Allocate` before answering, after journaling
    /// `allocating <ids>`: a test knob, so a test can kill the plugin while the agent waits.
    #[arg(long, default_value_t = 0)]
    allocate_delay_ms: u64,
}

/// Device ID → healthy.
type Devices = Vec<(String, bool)>;

struct Plugin {
    resource: String,
    options: api::DevicePluginOptions,
    numa: Option<i64>,
    devices: watch::Sender<Devices>,
    journal: Option<Mutex<std::fs::File>>,
    allocate_delay: Duration,
}

impl Plugin {
    fn note(&self, line: &str) {
        if let Some(j) = &self.journal {
            use std::io::Write as _;
            let mut f = j.lock().unwrap_or_else(|e| e.into_inner());
            let _ = writeln!(f, "{line}");
            let _ = f.flush();
        }
    }
}

/// The `ListAndWatch` answer for the current device states.
fn list(devices: &Devices, numa: Option<i64>) -> api::ListAndWatchResponse {
    api::ListAndWatchResponse {
        devices: devices
            .iter()
            .map(|(id, healthy)| api::Device {
                id: id.clone(),
                health: if *healthy { "Healthy" } else { "Unhealthy" }.to_string(),
                topology: numa.map(|n| api::TopologyInfo {
                    nodes: vec![api::NumaNode { id: n }],
                }),
            })
            .collect(),
    }
}

/// The number in `dev-<n>`, for ordering preferred devices.
fn device_number(id: &str) -> u64 {
    id.rsplit('-')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[tonic::async_trait]
impl api::device_plugin_server::DevicePlugin for Plugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(self.options))
    }

    type ListAndWatchStream =
        Pin<Box<dyn Stream<Item = Result<api::ListAndWatchResponse, Status>> + Send>>;

    async fn list_and_watch(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let numa = self.numa;
        let stream = tokio_stream::wrappers::WatchStream::new(self.devices.subscribe())
            .map(move |d| Ok(list(&d, numa)));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        let mut out = Vec::new();
        for c in request.into_inner().container_requests {
            let size = usize::try_from(c.allocation_size).unwrap_or(0);
            let mut chosen: Vec<String> = c.must_include_device_i_ds.clone();
            let mut rest: Vec<String> = c
                .available_device_i_ds
                .into_iter()
                .filter(|d| !chosen.contains(d))
                .collect();
            rest.sort_by_key(|d| std::cmp::Reverse(device_number(d)));
            for d in rest {
                if chosen.len() >= size {
                    break;
                }
                chosen.push(d);
            }
            self.note(&format!("preferred {}", chosen.join(",")));
            out.push(api::ContainerPreferredAllocationResponse {
                device_i_ds: chosen,
            });
        }
        Ok(Response::new(api::PreferredAllocationResponse {
            container_responses: out,
        }))
    }

    async fn allocate(
        &self,
        request: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let known: Vec<String> = self
            .devices
            .borrow()
            .iter()
            .map(|(d, _)| d.clone())
            .collect();
        let mut out = Vec::new();
        for c in request.into_inner().container_requests {
            let mut ids = c.devices_ids;
            ids.sort_by_key(|d| device_number(d));
            if let Some(unknown) = ids.iter().find(|d| !known.contains(d)) {
                return Err(Status::invalid_argument(format!(
                    "unknown device {unknown}"
                )));
            }
            let joined = ids.join(",");
            if !self.allocate_delay.is_zero() {
                self.note(&format!("allocating {joined}"));
                tokio::time::sleep(self.allocate_delay).await;
            }
            self.note(&format!("allocate {joined}"));
            out.push(api::ContainerAllocateResponse {
                envs: [
                    ("SAMPLE_DEVICES".to_string(), joined.clone()),
                    ("SAMPLE_RESOURCE".to_string(), self.resource.clone()),
                ]
                .into(),
                mounts: vec![],
                devices: ids
                    .iter()
                    .map(|d| api::DeviceSpec {
                        container_path: format!("/dev/sample/{d}"),
                        host_path: "/dev/null".to_string(),
                        permissions: "rw".to_string(),
                    })
                    .collect(),
                annotations: [("sample.example/devices".to_string(), joined)].into(),
                cdi_devices: vec![],
            });
        }
        Ok(Response::new(api::AllocateResponse {
            container_responses: out,
        }))
    }

    async fn pre_start_container(
        &self,
        request: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        let mut ids = request.into_inner().devices_ids;
        ids.sort_by_key(|d| device_number(d));
        self.note(&format!("prestart {}", ids.join(",")));
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}

/// Registers with the agent; `Err` carries the agent's refusal.
async fn register(args: &Args, socket_name: &str) -> anyhow::Result<Result<(), Status>> {
    let kubelet = args.dir.join("kubelet.sock");
    let channel = reactor::devices::dial_unix(&kubelet)
        .await
        .with_context(|| format!("cannot dial {}", kubelet.display()))?;
    let mut client = api::registration_client::RegistrationClient::new(channel);
    let answer = client
        .register(api::RegisterRequest {
            version: args.api_version.clone(),
            endpoint: socket_name.to_string(),
            resource_name: args.resource.clone(),
            options: Some(api::DevicePluginOptions {
                pre_start_required: args.pre_start,
                get_preferred_allocation_available: args.preferred,
            }),
        })
        .await;
    Ok(answer.map(|_| ()))
}

/// Identifies one incarnation of `kubelet.sock`: a re-created socket may reuse the inode
/// number, but not with the same change time.
fn kubelet_socket_id(args: &Args) -> Option<(u64, i64, i64)> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(args.dir.join("kubelet.sock"))
        .ok()
        .map(|m| (m.ino(), m.ctime(), m.ctime_nsec()))
}

async fn control(tx: watch::Sender<Devices>) {
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let mut words = line.split_whitespace();
        let (Some(cmd), Some(id)) = (words.next(), words.next()) else {
            continue;
        };
        let healthy = match cmd {
            "healthy" => true,
            "unhealthy" => false,
            other => {
                eprintln!("unknown command {other:?}: use `healthy ID` or `unhealthy ID`");
                continue;
            }
        };
        let mut found = false;
        tx.send_modify(|devs| {
            for (d, h) in devs.iter_mut() {
                if d == id {
                    *h = healthy;
                    found = true;
                }
            }
        });
        if found {
            println!(
                "{id} is now {}",
                if healthy { "healthy" } else { "unhealthy" }
            );
        } else {
            eprintln!("no device {id:?}");
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let socket_name = args
        .socket
        .clone()
        .unwrap_or_else(|| format!("sample-{}.sock", std::process::id()));
    if socket_name.contains('/') {
        anyhow::bail!("--socket {socket_name:?} must be a file name, not a path");
    }
    let socket = args.dir.join(&socket_name);
    let _ = std::fs::remove_file(&socket);
    let listener = tokio::net::UnixListener::bind(&socket)
        .with_context(|| format!("cannot listen on {}", socket.display()))?;
    let devices: Devices = (0..args.count)
        .map(|i| (format!("dev-{i}"), true))
        .collect();
    let (tx, _) = watch::channel(devices);
    let journal = match &args.journal {
        Some(p) => Some(Mutex::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .with_context(|| format!("cannot open journal {}", p.display()))?,
        )),
        None => None,
    };
    let plugin = Plugin {
        resource: args.resource.clone(),
        options: api::DevicePluginOptions {
            pre_start_required: args.pre_start,
            get_preferred_allocation_available: args.preferred,
        },
        numa: args.numa,
        devices: tx.clone(),
        journal,
        allocate_delay: Duration::from_millis(args.allocate_delay_ms),
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(api::device_plugin_server::DevicePluginServer::new(plugin))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::UnixListenerStream::new(listener),
                async {
                    let _ = stop_rx.await;
                },
            ),
    );

    let mut registered_socket = kubelet_socket_id(&args);
    match register(&args, &socket_name).await? {
        Ok(()) => println!(
            "registered {} with {} devices on {}",
            args.resource,
            args.count,
            socket.display()
        ),
        Err(status) => {
            eprintln!("registration refused: {}", status.message());
            let _ = std::fs::remove_file(&socket);
            std::process::exit(1);
        }
    }
    tokio::spawn(control(tx));

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
            _ = tick.tick() => {
                let now = kubelet_socket_id(&args);
                if now.is_none() {
                    // Gone: whatever appears next is a new agent to register with.
                    registered_socket = None;
                } else if now != registered_socket {
                    match register(&args, &socket_name).await {
                        Ok(Ok(())) => {
                            registered_socket = now;
                            println!("registered again after kubelet.sock was re-created");
                        }
                        Ok(Err(status)) => eprintln!("registration refused: {}", status.message()),
                        Err(e) => {
                            let e: &(dyn std::error::Error + 'static) = e.as_ref();
                            eprintln!("{}", reactor::human::error_chain(e));
                        }
                    }
                }
            }
        }
    }
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(2), server).await;
    let _ = std::fs::remove_file(&socket);
    Ok(())
}
