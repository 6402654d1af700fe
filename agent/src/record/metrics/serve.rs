//! The metrics endpoint: `GET /metrics` (the exposition) and `GET /healthz` (`ok`) over
//! HTTP/1, on the config's `metricsAddress`.
//!
//! Binding is a separate step from serving so the agent can fail at start, with one line
//! naming the address, before it attaches anything to the kernel; serving stops when the
//! agent's shutdown future resolves.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE as CONTENT_TYPE_HEADER;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;

use super::{Metrics, CONTENT_TYPE};

/// Why the endpoint could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// `metricsAddress` is not `host:port`.
    #[error("config key metricsAddress: {address:?} is not an address: {reason}")]
    Address {
        /// The text given.
        address: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The address could not be bound (in use, not local, no permission).
    #[error("cannot serve metrics on {address} (metricsAddress): {error}")]
    Bind {
        /// The address.
        address: SocketAddr,
        /// The kernel's reason (in the message, not a `source`, so it prints once).
        error: std::io::Error,
    },
    /// The server failed while running.
    #[error("metrics endpoint on {address} failed: {error}")]
    Serve {
        /// The address.
        address: SocketAddr,
        /// What failed.
        error: std::io::Error,
    },
}

/// Parses `metricsAddress`: `IP:PORT`, `[IPv6]:PORT`, `localhost:PORT`, or `:PORT` for every
/// interface (as Go's listeners read it, so exporters' usual spelling works).
pub fn parse_address(text: &str) -> Result<SocketAddr, ServeError> {
    let bad = |reason: &str| ServeError::Address {
        address: text.to_string(),
        reason: reason.to_string(),
    };
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(bad("expected HOST:PORT, e.g. 127.0.0.1:9464"));
    };
    let port: u16 = port
        .parse()
        .map_err(|_| bad("the port is not a number in 0..=65535"))?;
    let ip = match host {
        "" => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        "localhost" => IpAddr::V4(Ipv4Addr::LOCALHOST),
        _ => return Err(bad("the host must be an IP address, localhost, or empty")),
    };
    Ok(SocketAddr::new(ip, port))
}

/// A bound, not yet serving, metrics endpoint.
#[derive(Debug)]
pub struct MetricsServer {
    listener: TcpListener,
    address: SocketAddr,
}

impl MetricsServer {
    /// Binds an address from [`parse_address`]. Must run inside a tokio runtime.
    pub async fn bind(address: SocketAddr) -> Result<MetricsServer, ServeError> {
        let listener = TcpListener::bind(address)
            .await
            .map_err(|error| ServeError::Bind { address, error })?;
        let address = listener.local_addr().unwrap_or(address);
        Ok(MetricsServer { listener, address })
    }

    /// The address bound (with the port the kernel chose, if the config said port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.address
    }

    /// Serves until `shutdown` resolves; connections in flight are finished first.
    pub async fn serve(
        self,
        metrics: Arc<Metrics>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        let address = self.address;
        axum::serve(self.listener, router(metrics))
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(|error| ServeError::Serve { address, error })
    }
}

/// The routes: `/metrics` and `/healthz`.
pub(crate) fn router(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/metrics", get(exposition))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(metrics)
}

async fn exposition(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    ([(CONTENT_TYPE_HEADER, CONTENT_TYPE)], metrics.encode())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn addresses_parse_or_name_the_problem() {
        assert_eq!(
            parse_address("127.0.0.1:9464").unwrap(),
            "127.0.0.1:9464".parse().unwrap()
        );
        assert_eq!(
            parse_address("[::1]:9").unwrap(),
            "[::1]:9".parse().unwrap()
        );
        assert_eq!(
            parse_address(":9464").unwrap(),
            "0.0.0.0:9464".parse().unwrap()
        );
        assert_eq!(
            parse_address("localhost:1").unwrap(),
            "127.0.0.1:1".parse().unwrap()
        );
        for (bad, needle) in [
            ("9464", "HOST:PORT"),
            ("127.0.0.1:http", "port"),
            ("127.0.0.1:70000", "port"),
            ("example.com:9464", "host"),
        ] {
            let text = parse_address(bad).unwrap_err().to_string();
            assert!(
                text.contains("metricsAddress") && text.contains(needle),
                "{text}"
            );
            assert!(text.contains(bad), "{text}");
        }
    }

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn serves_metrics_and_health_over_tcp_and_stops_on_shutdown() {
        let metrics = Arc::new(Metrics::new());
        metrics.record_oom_kill();
        let server = MetricsServer::bind(parse_address("127.0.0.1:0").unwrap())
            .await
            .unwrap();
        let addr = server.local_addr();
        assert_ne!(addr.port(), 0);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(server.serve(metrics, async {
            let _ = rx.await;
        }));
        let page = get(addr, "/metrics").await;
        assert!(page.starts_with("HTTP/1.1 200"), "{page}");
        assert!(page.contains("application/openmetrics-text"), "{page}");
        assert!(page.contains("\nreactor_oom_kills_total 1\n"), "{page}");
        let health = get(addr, "/healthz").await;
        assert!(
            health.starts_with("HTTP/1.1 200") && health.ends_with("ok\n"),
            "{health}"
        );
        assert!(get(addr, "/nope").await.starts_with("HTTP/1.1 404"));
        tx.send(()).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), task)
            .await
            .expect("server stops on shutdown")
            .unwrap()
            .unwrap();
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    }

    #[tokio::test]
    async fn a_taken_address_is_a_one_line_error_naming_it() {
        let first = MetricsServer::bind(parse_address("127.0.0.1:0").unwrap())
            .await
            .unwrap();
        let addr = first.local_addr().to_string();
        let err = MetricsServer::bind(first.local_addr())
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&addr) && err.contains("metricsAddress"),
            "{err}"
        );
        assert!(!err.contains('\n'), "{err}");
    }
}
