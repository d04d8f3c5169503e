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

#[tokio::test]
async fn a_balanced_channel_reaches_every_tls_replica_by_its_name_and_goes_on_when_one_stops() {
    use flashsale_platform::balance;
    let pki = Pki::new("grpc-ca").unwrap();
    let own = pki.service("product-stock").unwrap();
    let server_tls = GrpcTlsSettings {
        cert_file: own.cert_path(),
        key_file: own.key_path(),
        client_ca_file: pki.ca_path(),
        ..GrpcTlsSettings::default()
    };
    let (a, stop_a) = server(server_tls.clone()).await;
    let (b, _stop_b) = server(server_tls).await;
    let client = pki.client("order").unwrap();
    let client_tls = GrpcTlsSettings {
        ca_file: pki.ca_path(),
        client_cert_file: client.cert_path(),
        client_key_file: client.key_path(),
        ..GrpcTlsSettings::default()
    };
    // `localhost` resolves to loopback addresses; the certificate is checked against the name
    // in the URL although the channel connects to each address.
    let urls = [
        format!("https://localhost:{a}"),
        format!("https://localhost:{b}"),
    ];
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let check = |tls: GrpcTlsSettings| {
        let channel = balance::channel(
            &urls,
            std::time::Duration::from_millis(100),
            std::time::Duration::from_secs(5),
            &tls,
        )
        .unwrap();
        async move {
            HealthClient::new(channel)
                .check(HealthCheckRequest::default())
                .await
                .map(drop)
        }
    };
    for _ in 0..10 {
        check(client_tls.clone()).await.unwrap();
    }
    // Another CA's view of the same servers: refused, never answered in plain text.
    let stranger = Pki::new("stranger").unwrap();
    let refused = check(GrpcTlsSettings {
        ca_file: stranger.ca_path(),
        ..client_tls.clone()
    })
    .await;
    assert!(refused.is_err());

    // One stops; the same channel settles on the other.
    let channel = balance::channel(
        &urls,
        std::time::Duration::from_millis(100),
        std::time::Duration::from_secs(5),
        &client_tls,
    )
    .unwrap();
    let mut health = HealthClient::new(channel);
    health.check(HealthCheckRequest::default()).await.unwrap();
    drop(stop_a);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut in_a_row = 0;
    while in_a_row < 10 {
        assert!(tokio::time::Instant::now() < deadline, "never settled");
        match health.check(HealthCheckRequest::default()).await {
            Ok(_) => in_a_row += 1,
            Err(_) => {
                in_a_row = 0;
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
    }
}
