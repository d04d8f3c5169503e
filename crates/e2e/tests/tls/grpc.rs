//! The gRPC server of every service with TLS and mutual TLS (`grpc.tls.*`), and its clients.

use flashsale_platform::{
    grpc::{ServerRoutes, bind, endpoint, serve},
    settings::GrpcSettings,
    tls::GrpcTlsSettings,
};
use flashsale_test_support::tls::Pki;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

/// A server with `tls` on a free port, answering health only; stopped when the sender drops.
async fn server(tls: GrpcTlsSettings) -> (u16, tokio::sync::oneshot::Sender<()>) {
    let settings = GrpcSettings {
        addr: "127.0.0.1:0".into(),
        tls,
        ..GrpcSettings::on_port(0)
    };
    let listener = bind(&settings).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        serve(listener, &settings, ServerRoutes::new(), async {
            let _ = stopped.await;
        })
        .await
    });
    (port, stop)
}

/// Whether a health check over `url` with `tls` succeeds.
async fn healthy(url: &str, tls: &GrpcTlsSettings) -> Result<(), String> {
    let channel = endpoint(url, tls)
        .map_err(|e| format!("{e:#}"))?
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    HealthClient::new(channel)
        .check(HealthCheckRequest::default())
        .await
        .map(drop)
        .map_err(|s| format!("{s:?}"))
}

#[tokio::test]
async fn a_mutual_tls_server_serves_clients_with_a_certificate_and_refuses_the_rest() {
    let pki = Pki::new("grpc-ca").unwrap();
    let own = pki.service("order").unwrap();
    let (port, _stop) = server(GrpcTlsSettings {
        cert_file: own.cert_path(),
        key_file: own.key_path(),
        client_ca_file: pki.ca_path(),
        ..GrpcTlsSettings::default()
    })
    .await;
    let url = format!("https://127.0.0.1:{port}");
    let client = pki.client("gateway").unwrap();
    let with_cert = GrpcTlsSettings {
        ca_file: pki.ca_path(),
        client_cert_file: client.cert_path(),
        client_key_file: client.key_path(),
        ..GrpcTlsSettings::default()
    };
    healthy(&url, &with_cert).await.unwrap();

    // No client certificate: refused in the handshake.
    let no_cert = GrpcTlsSettings {
        ca_file: pki.ca_path(),
        ..GrpcTlsSettings::default()
    };
    assert!(healthy(&url, &no_cert).await.is_err());
    // A certificate from another CA: refused.
    let stranger = Pki::new("stranger").unwrap();
    let foreign = stranger.client("gateway").unwrap();
    let foreign = GrpcTlsSettings {
        ca_file: pki.ca_path(),
        client_cert_file: foreign.cert_path(),
        client_key_file: foreign.key_path(),
        ..GrpcTlsSettings::default()
    };
    assert!(healthy(&url, &foreign).await.is_err());
    // Plain text to a TLS server: refused.
    let plain = format!("http://127.0.0.1:{port}");
    assert!(healthy(&plain, &with_cert).await.is_err());
    // The server's certificate checked against another CA: the client refuses.
    let wrong_ca = GrpcTlsSettings {
        ca_file: stranger.ca_path(),
        ..with_cert.clone()
    };
    assert!(healthy(&url, &wrong_ca).await.is_err());
}

#[tokio::test]
async fn an_https_url_never_falls_back_to_plain_text() {
    let (port, _stop) = server(GrpcTlsSettings::default()).await;
    let pki = Pki::new("grpc-ca").unwrap();
    let tls = GrpcTlsSettings {
        ca_file: pki.ca_path(),
        ..GrpcTlsSettings::default()
    };
    healthy(&format!("http://127.0.0.1:{port}"), &tls)
        .await
        .unwrap();
    assert!(
        healthy(&format!("https://127.0.0.1:{port}"), &tls)
            .await
            .is_err()
    );
}

#[tokio::test]
async fn server_tls_settings_that_cannot_work_are_refused_naming_the_key() {
    use flashsale_platform::config::Validate as _;
    let pki = Pki::new("grpc-ca").unwrap();
    let own = pki.service("order").unwrap();
    let not_pem = pki.dir().join("not-pem.txt");
    std::fs::write(&not_pem, "hello").unwrap();
    type Case = (&'static str, &'static str, GrpcTlsSettings);
    let cases: Vec<Case> = vec![
        (
            "order.grpc.tls.key_file",
            "must be set with cert_file",
            GrpcTlsSettings {
                cert_file: own.cert_path(),
                ..GrpcTlsSettings::default()
            },
        ),
        (
            "order.grpc.tls.cert_file",
            "cannot read",
            GrpcTlsSettings {
                cert_file: "/nonexistent/cert.pem".into(),
                key_file: own.key_path(),
                ..GrpcTlsSettings::default()
            },
        ),
        (
            "order.grpc.tls.client_ca_file",
            "needs the server's own certificate",
            GrpcTlsSettings {
                client_ca_file: pki.ca_path(),
                ..GrpcTlsSettings::default()
            },
        ),
        (
            "order.grpc.tls.ca_file",
            "is not PEM",
            GrpcTlsSettings {
                ca_file: not_pem.display().to_string(),
                ..GrpcTlsSettings::default()
            },
        ),
        (
            "order.grpc.tls.client_cert_file",
            "must be set with client_key_file",
            GrpcTlsSettings {
                client_key_file: own.key_path(),
                ..GrpcTlsSettings::default()
            },
        ),
    ];
    for (key, reason, tls) in cases {
        let settings = GrpcSettings {
            tls,
            ..GrpcSettings::on_port(0)
        };
        let err = settings.validate("order.grpc").unwrap_err().to_string();
        assert!(
            err.contains(key) && err.contains(reason),
            "`{err}` should name {key}: {reason}"
        );
    }
}
