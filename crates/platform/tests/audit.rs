//! Every admin call, allowed or refused, writes an audit line with its caller, action and
//! arguments; a buyer's own calls write none.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};

use flashsale_platform::auth::{Caller, Role, authorize};
use tonic::{Code, Request, Status};

/// Log lines written while `f` runs.
fn logged(f: impl FnOnce()) -> String {
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Buf::default();
    let out = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || out.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    tracing::subscriber::with_default(subscriber, f);
    let bytes = buf.0.lock().unwrap().clone();
    String::from_utf8(bytes).unwrap()
}

/// Stands for the proto message: only its name and `Debug` matter.
#[derive(Debug)]
#[allow(dead_code)]
struct AdjustStockRequest {
    sku: String,
    delta: i64,
}

fn as_caller<T>(message: T, subject: &str, role: Role) -> Request<T> {
    let mut r = Request::new(message);
    r.extensions_mut().insert(Caller {
        subject: subject.into(),
        role,
    });
    r
}

#[test]
fn admin_calls_are_logged_with_their_caller_action_and_arguments() {
    let req = as_caller(
        AdjustStockRequest {
            sku: "WINE-1".into(),
            delta: 50,
        },
        "ops-alice",
        Role::Admin,
    );
    let log = logged(|| {
        authorize(&req, &[Role::Admin]).unwrap();
    });
    for part in [
        "flashsale::audit",
        "admin action",
        "action=\"AdjustStock\"",
        "subject=ops-alice",
        "role=admin",
        "WINE-1",
        "delta: 50",
    ] {
        assert!(log.contains(part), "`{log}` lacks {part}");
    }

    // A refused attempt is logged too; a buyer's own calls are not audit lines.
    let req = as_caller(
        AdjustStockRequest {
            sku: "WINE-1".into(),
            delta: 50,
        },
        "mallory",
        Role::User,
    );
    let log = logged(|| {
        let e = authorize(&req, &[Role::Admin]).unwrap_err();
        assert_eq!(Status::from(e).code(), Code::PermissionDenied);
    });
    assert!(
        log.contains("admin action refused") && log.contains("subject=mallory"),
        "{log}"
    );
    let log = logged(|| {
        authorize(&req, &[Role::User]).unwrap();
    });
    assert!(!log.contains("flashsale::audit"), "{log}");
}
