//! The `Registration` service on `kubelet.sock`: the door device plugins knock on. It checks
//! what the kubelet checks, with the kubelet's words, then hands the plugin to the manager.

use std::sync::Arc;

use reactor_proto::deviceplugin_v1beta1 as api;
use tonic::{Request, Response, Status};

use super::names::{
    invalid_resource_name_message, is_extended_resource_name, unsupported_version_message,
    SUPPORTED_VERSIONS,
};
use super::plugins::Inner;

/// Serves `Registration.Register` for one manager.
pub(crate) struct RegistrationService {
    pub(crate) inner: Arc<Inner>,
}

/// A plugin's socket must be a file in the plugin directory, never a path out of it.
fn valid_endpoint(endpoint: &str) -> bool {
    !endpoint.is_empty() && !endpoint.contains('/') && endpoint != "." && endpoint != ".."
}

#[tonic::async_trait]
impl api::registration_server::Registration for RegistrationService {
    async fn register(
        &self,
        request: Request<api::RegisterRequest>,
    ) -> Result<Response<api::Empty>, Status> {
        let r = request.into_inner();
        tracing::info!(resource = %r.resource_name, endpoint = %r.endpoint, version = %r.version,
            "registration request from device plugin");
        if !SUPPORTED_VERSIONS.contains(&r.version.as_str()) {
            let msg = unsupported_version_message(&r.version);
            tracing::warn!(resource = %r.resource_name, "refused device plugin: {msg}");
            return Err(Status::invalid_argument(msg));
        }
        if !is_extended_resource_name(&r.resource_name) {
            let msg = invalid_resource_name_message(&r.resource_name);
            tracing::warn!("refused device plugin: {msg}");
            return Err(Status::invalid_argument(msg));
        }
        if !valid_endpoint(&r.endpoint) {
            let msg = format!(
                "the endpoint {:?} is invalid: it must be a socket file name in the device-plugin directory",
                r.endpoint
            );
            tracing::warn!(resource = %r.resource_name, "refused device plugin: {msg}");
            return Err(Status::invalid_argument(msg));
        }
        self.inner
            .connect_plugin(r.resource_name.clone(), &r.endpoint)
            .await
            .map_err(|e| {
                tracing::warn!(resource = %r.resource_name, "device plugin not connected: {e}");
                e.to_status()
            })?;
        Ok(Response::new(api::Empty {}))
    }
}

#[cfg(test)]
mod tests {
    use super::valid_endpoint;

    #[test]
    fn endpoints_stay_in_the_directory() {
        assert!(valid_endpoint("plugin.sock"));
        for bad in ["", ".", "..", "../kubelet.sock", "/tmp/x.sock", "a/b.sock"] {
            assert!(!valid_endpoint(bad), "{bad}");
        }
    }
}
