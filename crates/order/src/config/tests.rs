use super::*;

/// The settings from the files in `dir` (none there: the defaults) and the environment `vars`.
fn load_with_env(dir: &std::path::Path, vars: &[(&str, &str)]) -> Result<Settings, ConfigError> {
    let env = config::Environment::with_prefix("FLASHSALE")
        .prefix_separator("_")
        .separator("__")
        .try_parsing(true)
        .source(Some(
            vars.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        ));
    flashsale_platform::config::load_from(SERVICE_KEY, &Settings::default(), dir, None, env)
}

#[test]
fn bad_saga_values_name_their_key() {
    let cases: [Case; 33] = [
        ("order.saga.payment_timeout_ms", |s| {
            s.saga.payment_timeout_ms = 0
        }),
        ("order.saga.sweep_interval_ms", |s| {
            s.saga.sweep_interval_ms = 0
        }),
        ("order.saga.sold_out_cache_ms", |s| {
            s.saga.sold_out_cache_ms = 3_600_000
        }),
        ("order.saga.max_quantity", |s| s.saga.max_quantity = 0),
        ("order.saga.intake_quiet_ms", |s| {
            s.saga.intake_quiet_ms = 10_001
        }),
        ("order.saga.intake_max_lag_ms", |s| {
            s.saga.intake_max_lag_ms = 0
        }),
        ("order.saga.intake_max_lag_ms", |s| {
            s.saga.intake_max_lag_ms = 60_001
        }),
        ("order.saga.stuck_after_ms", |s| s.saga.stuck_after_ms = 999),
        ("order.saga.stuck_after_ms", |s| {
            s.saga.stuck_after_ms = 31 * 86_400_000
        }),
        ("order.saga.stuck_check_interval_ms", |s| {
            s.saga.stuck_check_interval_ms = 0
        }),
        ("order.saga.stuck_check_interval_ms", |s| {
            s.saga.stuck_check_interval_ms = 3_600_001
        }),
        ("order.saga.intake_write_deadline_ms", |s| {
            s.saga.intake_write_deadline_ms = 9
        }),
        ("order.saga.intake_write_deadline_ms", |s| {
            s.saga.intake_write_deadline_ms = MAX_INTAKE_WRITE_DEADLINE_MS + 1
        }),
        ("order.upstream.product_stock_url", |s| {
            s.upstream.product_stock_url = "ftp://x".into()
        }),
        ("order.upstream.product_stock_url", |s| {
            s.upstream.product_stock_url = "http://a:1, http://b:1,".into()
        }),
        ("order.upstream.product_stock_url", |s| {
            s.upstream.product_stock_url = "http://a:1,https://b:1,http://a:1".into()
        }),
        ("order.upstream.product_stock_refresh_ms", |s| {
            s.upstream.product_stock_refresh_ms = 99
        }),
        ("order.upstream.product_stock_refresh_ms", |s| {
            s.upstream.product_stock_refresh_ms = 600_001
        }),
        ("order.limits.create_order_per_sec", |s| {
            s.limits.create_order_per_sec = MAX_RATE + 1
        }),
        ("order.limits.create_order_burst", |s| {
            s.limits.create_order_burst = 0
        }),
        ("order.limits.pay_order_per_sec", |s| {
            s.limits.pay_order_per_sec = MAX_RATE + 1
        }),
        ("order.limits.pay_order_burst", |s| {
            s.limits.pay_order_burst = 0
        }),
        ("order.limits.watch_streams_per_user", |s| {
            s.limits.watch_streams_per_user = 0
        }),
        ("order.limits.watch_streams_per_user", |s| {
            s.limits.watch_streams_per_user = 10_001
        }),
        ("order.limits.read_per_sec", |s| {
            s.limits.read_per_sec = MAX_RATE + 1
        }),
        ("order.limits.read_burst", |s| s.limits.read_burst = 0),
        ("order.limits.cancel_order_per_sec", |s| {
            s.limits.cancel_order_per_sec = MAX_RATE + 1
        }),
        ("order.limits.cancel_order_burst", |s| {
            s.limits.cancel_order_burst = 0
        }),
        ("order.limits.notify_in_flight_per_peer", |s| {
            s.limits.notify_in_flight_per_peer = 0
        }),
        ("order.limits.notify_in_flight_per_peer", |s| {
            s.limits.notify_in_flight_per_peer = 1_000_001
        }),
        ("order.limits.notify_body_timeout_ms", |s| {
            s.limits.notify_body_timeout_ms = 9
        }),
        ("order.limits.notify_body_timeout_ms", |s| {
            s.limits.notify_body_timeout_ms = 60_001
        }),
        ("order.grpc.max_concurrent_requests", |s| {
            s.grpc.max_concurrent_requests = 0
        }),
    ];
    each_is_refused_naming_its_key(&cases);
}

type Case = flashsale_test_support::settings::Case<Settings>;

/// Each `(key, mutate)` makes a valid configuration invalid; validation must refuse it and
/// name `key`.
fn each_is_refused_naming_its_key(cases: &[Case]) {
    flashsale_test_support::settings::each_is_refused_naming_its_key(&valid(), SERVICE_KEY, cases);
}

/// Settings that pass: the defaults with the secrets a deployment must set.
fn valid() -> Settings {
    let mut s = Settings::default();
    s.payment.api_key = "k".repeat(32);
    s.payment.webhook_secret = "w".repeat(32);
    s
}

#[test]
fn bad_payment_values_name_their_key() {
    let cases: [Case; 20] = [
        ("order.payment.provider_url", |s| {
            s.payment.provider_url = "not a url".into()
        }),
        ("order.payment.provider_url", |s| {
            s.payment.provider_url = "ftp://pay".into()
        }),
        ("order.payment.api_key", |s| s.payment.api_key.clear()),
        ("order.payment.api_key", |s| {
            s.payment.api_key = "short".into()
        }),
        ("order.payment.webhook_secret", |s| {
            s.payment.webhook_secret.clear()
        }),
        ("order.payment.webhook_secret", |s| {
            s.payment.webhook_secret = "x".repeat(31)
        }),
        ("order.payment.notify_url", |s| {
            s.payment.notify_url = "127.0.0.1:50052".into()
        }),
        ("order.payment.currency", |s| {
            s.payment.currency = "eur".into()
        }),
        ("order.payment.currency", |s| s.payment.currency.clear()),
        ("order.payment.call_timeout_ms", |s| {
            s.payment.call_timeout_ms = 0
        }),
        ("order.payment.notification_tolerance_ms", |s| {
            s.payment.notification_tolerance_ms = 999
        }),
        ("order.payment.refund_max_attempts", |s| {
            s.payment.refund_max_attempts = 0
        }),
        ("order.payment.refund_max_attempts", |s| {
            s.payment.refund_max_attempts = 101
        }),
        ("order.payment.refund_retry_base_ms", |s| {
            s.payment.refund_retry_base_ms = 600_001
        }),
        ("order.payment.refund_sweep_interval_ms", |s| {
            s.payment.refund_sweep_interval_ms = 0
        }),
        ("order.payment.refund_sweep_interval_ms", |s| {
            s.payment.refund_sweep_interval_ms = 3_600_001
        }),
        ("order.payment.reconcile_after_ms", |s| {
            s.payment.reconcile_after_ms = 999
        }),
        ("order.payment.reconcile_after_ms", |s| {
            s.payment.reconcile_after_ms = 86_400_001
        }),
        ("order.payment.reconcile_interval_ms", |s| {
            s.payment.reconcile_interval_ms = 0
        }),
        ("order.payment.reconcile_interval_ms", |s| {
            s.payment.reconcile_interval_ms = 3_600_001
        }),
    ];
    each_is_refused_naming_its_key(&cases);
}

#[test]
fn a_missing_payment_secret_is_refused_with_its_key_and_never_printed() {
    let mut s = valid();
    s.payment.webhook_secret.clear();
    let e = s.validate(SERVICE_KEY).unwrap_err().to_string();
    assert!(e.contains("order.payment.webhook_secret"), "{e}");
    assert!(e.contains("not set"), "{e}");
    let shown = format!("{:?}", valid().payment);
    assert!(!shown.contains(&"w".repeat(32)) && !shown.contains(&"k".repeat(32)));
}

#[test]
fn limits_load_from_file_and_environment_and_bad_ones_name_their_key() {
    let dir = std::env::temp_dir().join(format!("fs-order-limits-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("default.toml"),
        "[order.limits]\ncreate_order_per_sec = 3\nwatch_streams_per_user = 2\n\n\
         [order.payment]\napi_key = \"kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk\"\n\
         webhook_secret = \"wwwwwwwwwwwwwwwwwwwwwwwwwwwwwwww\"\n",
    )
    .unwrap();
    let load = |vars: &[(&str, &str)]| load_with_env(&dir, vars);
    let s = load(&[("FLASHSALE_ORDER__LIMITS__PAY_ORDER_BURST", "4")]).unwrap();
    assert_eq!(
        (
            s.limits.create_order_per_sec,
            s.limits.watch_streams_per_user,
            s.limits.pay_order_burst,
            s.limits.create_order_burst
        ),
        (3, 2, 4, LimitSettings::default().create_order_burst)
    );
    for (var, value, key) in [
        (
            "FLASHSALE_ORDER__LIMITS__CREATE_ORDER_PER_SEC",
            "fast",
            "order.limits.create_order_per_sec",
        ),
        (
            "FLASHSALE_ORDER__LIMITS__CREATE_ORDER_PER_SEC",
            "-1",
            "order.limits.create_order_per_sec",
        ),
        (
            "FLASHSALE_ORDER__LIMITS__WATCH_STREAMS_PER_USER",
            "0",
            "order.limits.watch_streams_per_user",
        ),
        (
            "FLASHSALE_ORDER__LIMITS__PAY_ORDER_BURST",
            "0",
            "order.limits.pay_order_burst",
        ),
    ] {
        let e = load(&[(var, value)])
            .map(|_| String::new())
            .unwrap_or_else(|e| e.to_string());
        assert!(e.contains(key), "{var}={value}: `{e}` does not name {key}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_intake_write_deadline_loads_from_the_environment_and_a_bad_one_names_its_key() {
    let dir = std::env::temp_dir().join(format!("fs-order-deadline-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("default.toml"),
        "[order.payment]\napi_key = \"kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk\"\n\
         webhook_secret = \"wwwwwwwwwwwwwwwwwwwwwwwwwwwwwwww\"\n",
    )
    .unwrap();
    let load = |value: &str| {
        let env = config::Environment::with_prefix("FLASHSALE")
            .prefix_separator("_")
            .separator("__")
            .try_parsing(true)
            .source(Some(std::collections::HashMap::from([(
                "FLASHSALE_ORDER__SAGA__INTAKE_WRITE_DEADLINE_MS".to_owned(),
                value.to_owned(),
            )])));
        flashsale_platform::config::load_from(SERVICE_KEY, &Settings::default(), &dir, None, env)
    };
    let loaded = load("2500").map(|s| s.saga.intake_write_deadline_ms);
    let refused: Vec<String> = ["soon", "-1", "0", "60001"]
        .iter()
        .map(|v| {
            load(v)
                .map(|_| String::new())
                .unwrap_or_else(|e| e.to_string())
        })
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(loaded.unwrap(), 2_500);
    for e in refused {
        assert!(
            e.contains("order.saga.intake_write_deadline_ms"),
            "`{e}` does not name the key"
        );
    }
}

#[test]
fn a_config_with_the_old_redis_section_still_loads() {
    let dir = std::env::temp_dir().join(format!("fs-order-config-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("default.toml"),
        "[order.redis]\nurl = \"redis://127.0.0.1:6379\"\npool_size = 32\n\n\
         [order.saga]\nmax_quantity = 7\n\n\
         [order.payment]\napi_key = \"kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk\"\n\
         webhook_secret = \"wwwwwwwwwwwwwwwwwwwwwwwwwwwwwwww\"\n",
    )
    .unwrap();
    let env = config::Environment::with_prefix("FLASHSALE")
        .prefix_separator("_")
        .separator("__")
        .source(Some(std::collections::HashMap::from([(
            "FLASHSALE_ORDER__REDIS__URL".to_owned(),
            "redis://elsewhere:6379".to_owned(),
        )])));
    let loaded =
        flashsale_platform::config::load_from(SERVICE_KEY, &Settings::default(), &dir, None, env);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(loaded.unwrap().saga.max_quantity, 7);
}

#[test]
fn bad_admission_values_name_their_key() {
    let cases: [Case; 6] = [
        ("order.admission.max_unconfirmed", |s| {
            s.admission.max_unconfirmed = MAX_ADMISSION_BOUND + 1
        }),
        ("order.admission.max_unshipped", |s| {
            s.admission.max_unshipped = MAX_ADMISSION_BOUND + 1
        }),
        ("order.admission.check_interval_ms", |s| {
            s.admission.check_interval_ms = 9
        }),
        ("order.admission.check_interval_ms", |s| {
            s.admission.check_interval_ms = 60_001
        }),
        ("order.admission.retry_after_ms", |s| {
            s.admission.retry_after_ms = 0
        }),
        ("order.admission.retry_after_ms", |s| {
            s.admission.retry_after_ms = 600_001
        }),
    ];
    each_is_refused_naming_its_key(&cases);
}

#[test]
fn admission_bounds_load_from_the_environment_and_bad_ones_name_their_key() {
    let dir = std::env::temp_dir().join("fs-order-admission-none");
    let load = |vars: &[(&str, &str)]| load_with_env(&dir, vars);
    let secrets = [
        ("FLASHSALE_ORDER__PAYMENT__API_KEY", "k".repeat(32)),
        ("FLASHSALE_ORDER__PAYMENT__WEBHOOK_SECRET", "w".repeat(32)),
    ];
    let with = |extra: &[(&str, &str)]| {
        let mut vars: Vec<(&str, &str)> = secrets.iter().map(|(k, v)| (*k, v.as_str())).collect();
        vars.extend_from_slice(extra);
        load(&vars)
    };
    let s = with(&[
        ("FLASHSALE_ORDER__ADMISSION__MAX_UNCONFIRMED", "2000"),
        ("FLASHSALE_ORDER__ADMISSION__MAX_UNSHIPPED", "0"),
    ])
    .unwrap();
    assert_eq!(
        (
            s.admission.max_unconfirmed,
            s.admission.max_unshipped,
            s.admission.retry_after_ms
        ),
        (2_000, 0, AdmissionSettings::default().retry_after_ms)
    );
    for (var, value, key) in [
        (
            "FLASHSALE_ORDER__ADMISSION__MAX_UNCONFIRMED",
            "lots",
            "order.admission.max_unconfirmed",
        ),
        (
            "FLASHSALE_ORDER__ADMISSION__MAX_UNSHIPPED",
            "-1",
            "order.admission.max_unshipped",
        ),
        (
            "FLASHSALE_ORDER__ADMISSION__CHECK_INTERVAL_MS",
            "0",
            "order.admission.check_interval_ms",
        ),
        (
            "FLASHSALE_ORDER__ADMISSION__RETRY_AFTER_MS",
            "soon",
            "order.admission.retry_after_ms",
        ),
    ] {
        let e = with(&[(var, value)])
            .map(|_| String::new())
            .unwrap_or_else(|e| e.to_string());
        assert!(e.contains(key), "{var}={value}: `{e}` does not name {key}");
    }
}
