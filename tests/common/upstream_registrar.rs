//! A registrar that behaves like upstream node-driver-registrar where it hurts: on
//! `NotifyRegistrationStatus(false)` it "exits" (stops serving at once, without a reply, and
//! leaves its socket behind). It records the path of every gRPC call that reaches its socket,
//! whatever the service, so a test can tell exactly what a client asked.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use csi_nodekit::proto::registration::registration_server::{Registration, RegistrationServer};
use csi_nodekit::proto::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use csi_nodekit::shutdown::{Shutdown, Trigger};
use tonic::{Request, Response, Status};

/// What the fake saw.
#[derive(Debug, Default)]
pub struct Record {
    /// Every request path, in order (`/pluginregistration.Registration/GetInfo`, …).
    pub calls: Mutex<Vec<String>>,
    pub exited: AtomicBool,
}

impl Record {
    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    pub fn exited(&self) -> bool {
        self.exited.load(Ordering::SeqCst)
    }
}

struct Service {
    info: PluginInfo,
    record: Arc<Record>,
    exit: Arc<Mutex<Option<Trigger>>>,
}

#[tonic::async_trait]
impl Registration for Service {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        if !request.into_inner().plugin_registered {
            // Upstream calls os.Exit(1) inside the handler: no reply, socket left behind.
            self.record.exited.store(true, Ordering::SeqCst);
            if let Some(exit) = self.exit.lock().unwrap().take() {
                exit.fire();
            }
            std::future::pending::<()>().await;
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// The fake, serving `info` on `socket` (bound at the path, as Go does), until dropped.
pub struct UpstreamRegistrar {
    pub record: Arc<Record>,
    exit: Arc<Mutex<Option<Trigger>>>,
}

impl UpstreamRegistrar {
    pub fn start(socket: &Path, info: PluginInfo) -> Self {
        std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
        let listener = tokio::net::UnixListener::bind(socket).unwrap();
        let record = Arc::new(Record::default());
        let (trigger, stopped) = Shutdown::manual();
        let exit = Arc::new(Mutex::new(Some(trigger)));
        let service = Service {
            info,
            record: record.clone(),
            exit: exit.clone(),
        };
        let calls = record.clone();
        let log_every_call =
            tower::util::MapRequestLayer::new(move |request: http::Request<tonic::body::Body>| {
                let path = request.uri().path().to_owned();
                calls.calls.lock().unwrap().push(path);
                request
            });
        tokio::spawn(async move {
            let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
            let _ = tonic::transport::Server::builder()
                .layer(log_every_call)
                .add_service(RegistrationServer::new(service))
                .serve_with_incoming_shutdown(incoming, stopped.wait())
                .await;
        });
        Self { record, exit }
    }
}

impl Drop for UpstreamRegistrar {
    fn drop(&mut self) {
        if let Some(exit) = self.exit.lock().unwrap().take() {
            exit.fire();
        }
    }
}
