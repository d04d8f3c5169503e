//! `flashsale bench` against the three services in-process: every mode runs, the platform's
//! accepted orders are followed until the saga confirms them, memory is read for the pids named;
//! bad options are refused naming the flag before anything is measured.

use flashsale_test_support::TestDatabase;
use serde_json::Value;

use crate::{
    full_stack::FullStack,
    helpers::{command, flashsale, output},
};

#[tokio::test]
async fn bench_refuses_bad_options_naming_the_flag() {
    let nowhere = "http://127.0.0.1:1";
    let cases: [(&[&str], &str); 28] = [
        (&["--rounds", "0"], "--rounds"),
        (&["--rounds", "21"], "--rounds"),
        (&["--connections", "0"], "--connections"),
        (&["--connections", "65"], "--connections"),
        (&["--connections", "two"], "--connections"),
        (&["--naive-db", "Bench"], "--naive-db"),
        (&["--naive-db", "a;drop"], "--naive-db"),
        (&["--insert-db", ""], "--insert-db"),
        (&["--stats-db", "Orders"], "--stats-db"),
        (&["--stats-db", "a,b;drop"], "--stats-db"),
        (&["--db-pool", "0"], "--db-pool"),
        (&["--db-pool", "101"], "--db-pool"),
        (&["--db-pool", "many"], "--db-pool"),
        (&["--service-pid", "order"], "--service-pid"),
        (&["--service-pid", "order=abc"], "--service-pid"),
        (&["--service-pid", "=42"], "--service-pid"),
        (&["--service-pid", "order=0"], "--service-pid"),
        (
            &["--service-pid", "order=1", "--service-pid", "x y=2"],
            "--service-pid",
        ),
        (&["--stock-buckets", "0"], "--stock-buckets"),
        (&["--stock-buckets", "65"], "--stock-buckets"),
        (&["--stock-buckets", "eight"], "--stock-buckets"),
        (
            &["--order-url", "http://127.0.0.1:1,,http://127.0.0.1:2"],
            "--order-url",
        ),
        (&["--max-idle-wait-secs", "601"], "--max-idle-wait-secs"),
        (&["--max-idle-wait-secs=-1"], "--max-idle-wait-secs"),
        (
            &["--orders-db-url", "http://127.0.0.1/orders"],
            "--orders-db-url",
        ),
        (&["--orders-db-url", "not a url"], "--orders-db-url"),
        (
            &["--metrics-url", "127.0.0.1:9102/metrics"],
            "--metrics-url",
        ),
        (
            &["--metrics-url", "https://127.0.0.1:9102/metrics"],
            "--metrics-url",
        ),
    ];
    for (args, flag) in cases {
        let mut full = vec![
            "bench",
            "--order-url",
            nowhere,
            "--postgres-url",
            "postgres://nobody@127.0.0.1:1",
            "--redis-url",
            "redis://127.0.0.1:1",
        ];
        full.extend_from_slice(args);
        let run = flashsale(&full, nowhere).await;
        assert!(!run.ok, "{args:?} was accepted: {}", run.stdout);
        assert!(
            run.stderr.contains(flag),
            "{args:?}: stderr does not name {flag}: {}",
            run.stderr
        );
        assert!(
            !run.stderr.contains("bench: "),
            "{args:?} got as far as measuring: {}",
            run.stderr
        );
    }
}

#[tokio::test]
async fn a_small_bench_follows_the_saga_and_reads_the_services_memory() {
    let stack = FullStack::spawn(|_| {}).await;
    let me = format!("stack={}", std::process::id());
    let (naive_db, insert_db) = (
        TestDatabase::create().await.unwrap(),
        TestDatabase::create().await.unwrap(),
    );
    let mut cmd = command(&[
        "bench",
        "--naive-db",
        &naive_db.name,
        "--insert-db",
        &insert_db.name,
        "--scenario",
        "big-sale",
        "--requests",
        "40",
        "--buyers",
        "40",
        "--stock",
        "10",
        "--concurrency",
        "4",
        "--db-pool",
        "2",
        "--max-seconds-per-mode",
        "30",
        "--max-idle-wait-secs",
        "1",
        "--service-pid",
        &me,
        "--postgres-url",
        &flashsale_test_support::postgres_server_url(),
        "--redis-url",
        &flashsale_test_support::redis_url(),
        "--metrics-url",
        &stack.order_metrics_url,
        "--json",
    ]);
    cmd.env("FLASHSALE_PRODUCT_STOCK_URL", &stack.stock_url)
        .env("FLASHSALE_ORDER_URL", &stack.order_url);
    let run = output(cmd).await;
    let r = run.json();
    let modes = r["modes"].as_array().unwrap();
    assert_eq!(modes.len(), 5, "{r}");
    // The order service's batchers during the platform mode (its recorder is shared with the
    // other tests' services in this process, so they may add to the figures, never take).
    let batches = modes[4]["batches"].as_array().unwrap();
    let calls = |name: &str| {
        batches
            .iter()
            .find(|b| b["batch"] == name)
            .and_then(|b| b["calls"].as_u64())
            .unwrap_or(0)
    };
    assert!(calls("order_gate") >= 10, "{batches:?}");
    assert!(calls("order_write") >= 10, "{batches:?}");
    assert!(calls("order_stock_reserved") >= 10, "{batches:?}");
    for b in batches {
        assert!(b["run_ms"].as_f64().unwrap() > 0.0, "{b}");
        assert!(b["calls_per_batch"].as_f64().unwrap() >= 1.0, "{b}");
    }
    assert_eq!(r["db_pool"], 2, "{r}");
    for m in modes {
        assert_eq!(m["errored"], 0, "{m}");
        let mem = &m["memory"][0];
        assert_eq!(mem["service"], "stack", "{m}");
        assert!(mem["peak_rss_mib"].as_f64().unwrap() > 1.0, "{m}");
        // VmHWM is the process's lifetime peak; the kernel updates it lazily, so it is only
        // roughly above the sampled peak.
        assert!(mem["vm_hwm_mib"].as_f64().unwrap() > 1.0, "{m}");
        assert!(m["idle_wait_s"].as_f64().unwrap() <= 3.0, "{m}");
        // Such short modes may end within one CPU sample: then a window is null, never absent.
        let cpu = m["cpu"].as_object().unwrap();
        assert!(
            cpu.contains_key("requests") && cpu.contains_key("intake"),
            "{m}"
        );
    }
    let naive = &modes[1];
    assert_eq!(naive["accepted"], 10, "{naive}");
    assert!(naive["intake_s"].as_f64().unwrap() <= naive["elapsed_s"].as_f64().unwrap());
    assert!(
        naive["accepted_latency_ms"]["p99"].as_f64().unwrap() > 0.0,
        "{naive}"
    );
    let platform = &modes[4];
    assert_eq!(platform["accepted"], 10, "{platform}");
    let saga = &platform["saga"];
    assert_eq!(
        (&saga["followed"], &saga["confirmed"], &saga["unconfirmed"]),
        (&Value::from(10), &Value::from(10), &Value::from(0)),
        "{saga}"
    );
    assert!(saga["confirm_s"].as_f64().unwrap() > 0.0, "{saga}");
    assert!(saga["confirmed_per_s"].as_f64().unwrap() > 0.0, "{saga}");
    let ratios = &r["ratios"];
    for key in [
        "platform/naive accepted per second",
        "platform/naive accepted p99",
        "platform saga confirmed/raw insert throughput",
        "platform/raw_insert throughput",
    ] {
        assert!(ratios[key].is_number(), "no {key}: {ratios}");
    }
}

#[tokio::test]
async fn the_saga_follower_can_read_the_order_database_instead_of_the_api() {
    let stack = FullStack::spawn(|_| {}).await;
    let mut cmd = command(&[
        "bench",
        "--scenario",
        "big-sale",
        "--modes",
        "platform",
        "--requests",
        "40",
        "--buyers",
        "40",
        "--stock",
        "10",
        "--concurrency",
        "4",
        "--max-seconds-per-mode",
        "30",
        "--max-idle-wait-secs",
        "0",
        "--orders-db-url",
        &stack.order_db_url,
        "--json",
    ]);
    cmd.env("FLASHSALE_PRODUCT_STOCK_URL", &stack.stock_url)
        .env("FLASHSALE_ORDER_URL", &stack.order_url);
    let run = output(cmd).await;
    let r = run.json();
    let platform = &r["modes"][0];
    assert_eq!(platform["accepted"], 10, "{platform}");
    let saga = &platform["saga"];
    assert_eq!(
        (&saga["followed"], &saga["confirmed"], &saga["unconfirmed"]),
        (&Value::from(10), &Value::from(10), &Value::from(0)),
        "{saga}"
    );
    assert!(saga["confirm_s"].as_f64().unwrap() > 0.0, "{saga}");
}

#[tokio::test]
async fn the_naive_design_keeps_the_per_user_limit_and_the_bare_row_does_not() {
    // 5 buyers with 8 requests each for 10 units, one per buyer (the scenarios' limit): the
    // naive design sells 5 and refuses the rest by limit; the bare hot row sells all 10.
    let db = TestDatabase::create().await.unwrap();
    let args = naive_args(&db.name);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let cmd = command(&args);
    let run = output(cmd).await;
    let r = run.json();
    let modes = r["modes"].as_array().unwrap();
    assert_eq!(modes.len(), 2, "{r}");
    let (naive, bare) = (&modes[0], &modes[1]);
    assert_eq!(naive["accepted"], 5, "{naive}");
    assert_eq!(naive["refused"]["USER_LIMIT"], 35, "{naive}");
    assert_eq!(naive["errored"], 0, "{naive}");
    assert_eq!(bare["accepted"], 10, "{bare}");
    assert_eq!(bare["refused"]["SOLD_OUT"], 30, "{bare}");
    assert!(
        r["ratios"].as_object().is_some_and(|o| o.is_empty()),
        "no platform run, no ratios: {r}"
    );

    // A database holding orders the bench did not write is refused, not emptied.
    let conn = db.connect().await.unwrap();
    sea_orm::ConnectionTrait::execute_unprepared(
        &conn,
        "INSERT INTO orders (order_id, user_id, request_id, sku, quantity, unit_price_cents, total_cents, \
         deduction_policy, status) VALUES (gen_random_uuid(), 'alice', 'live-1', 'LIVE-1', 1, 10, 10, \
         'RESERVE_THEN_COMMIT', 'PENDING')",
    )
    .await
    .unwrap();
    let refused = flashsale(&args, "http://127.0.0.1:1").await;
    assert!(!refused.ok, "{}", refused.stdout);
    assert!(refused.stderr.contains("--naive-db"), "{}", refused.stderr);
    let left = sea_orm::ConnectionTrait::query_one_raw(
        &conn,
        sea_orm::Statement::from_string(
            sea_orm::DatabaseBackend::Postgres,
            "SELECT count(*) AS n FROM orders WHERE sku = 'LIVE-1'",
        ),
    )
    .await
    .unwrap()
    .unwrap()
    .try_get::<i64>("", "n")
    .unwrap();
    assert_eq!(left, 1, "the live order was kept");
    conn.close().await.unwrap();
}

#[tokio::test]
async fn a_design_that_gives_units_back_fails_the_run_and_says_which_invariant_broke() {
    // The naive design with a planted bug: every order written gives its unit back to the hot
    // row, so the row and the orders no longer add up to the stock.
    let db = TestDatabase::create().await.unwrap();
    let args = naive_args(&db.name);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let clean = output(command(&args)).await;
    let r = clean.json();
    assert_eq!(r["passed"], true, "{r}");
    let checks = r["modes"][0]["checks"].as_array().unwrap();
    assert!(checks.iter().any(|c| c["name"] == "stock conserved"), "{r}");
    let conn = db.connect().await.unwrap();
    sea_orm::ConnectionTrait::execute_unprepared(
        &conn,
        "CREATE FUNCTION give_back() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN            UPDATE naive_stock SET available = available + 1 WHERE sku = NEW.sku; RETURN NEW; END $$;          CREATE TRIGGER give_back AFTER INSERT ON orders FOR EACH ROW EXECUTE FUNCTION give_back()",
    )
    .await
    .unwrap();
    conn.close().await.unwrap();
    let broken = output(command(&args)).await;
    assert!(!broken.ok, "the run passed: {}", broken.stderr);
    assert!(
        broken.stderr.contains("invariant FAILED: stock conserved"),
        "{}",
        broken.stderr
    );
    let r: Value = serde_json::from_str(&broken.stdout).unwrap();
    assert_eq!(r["passed"], false, "{r}");
    let naive = &r["modes"][0];
    assert_eq!(naive["errored"], 0, "the run itself went through: {naive}");
    let failed: Vec<&Value> = naive["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["pass"] == false)
        .map(|c| &c["name"])
        .collect();
    assert!(failed.contains(&&Value::from("stock conserved")), "{naive}");
    // The bare hot row does not use the orders table: its checks still pass.
    assert_eq!(r["modes"][1]["passed"], true, "{r}");
}

#[tokio::test]
async fn the_refusals_mode_reads_the_servers_counters_around_a_sold_out_flood() {
    // The sold-out orders stay unpaid through the stretch and its quiet (as in the benchmark):
    // a timeout would give their units back to the late buyers.
    let stack = FullStack::spawn_with(600_000, |_| {}).await;
    let mut cmd = command(&[
        "bench",
        "--scenario",
        "flood",
        "--modes",
        "refusals",
        "--requests",
        "300",
        "--buyers",
        "100",
        "--concurrency",
        "8",
        "--max-seconds-per-mode",
        "60",
        "--max-idle-wait-secs",
        "0",
        "--orders-db-url",
        &stack.order_db_url,
        "--postgres-url",
        &flashsale_test_support::postgres_server_url(),
        "--redis-url",
        &flashsale_test_support::redis_url(),
        "--json",
    ]);
    cmd.env("FLASHSALE_PRODUCT_STOCK_URL", &stack.stock_url)
        .env("FLASHSALE_ORDER_URL", &stack.order_url);
    let run = output(cmd).await;
    let r = run.json();
    assert_eq!(r["passed"], true, "{r}");
    let mode = &r["modes"][0];
    assert_eq!(mode["accepted"], 0, "{mode}");
    let refusals = &mode["refusals"];
    assert_eq!(refusals["sell_out_accepted"], 200, "{refusals}");
    assert_eq!(refusals["refused"], 300, "{refusals}");
    assert_eq!(mode["refused"]["SOLD_OUT"], 300, "{mode}");
    for counter in ["pg.xact_commit", "pg.tup_inserted", "redis.calls"] {
        assert!(
            refusals["during"][counter].is_i64(),
            "{counter}: {refusals}"
        );
        assert!(
            refusals["net_per_refused"][counter].is_f64(),
            "{counter}: {refusals}"
        );
    }
    // The sell-out's 200 orders, confirmed, are checked like any platform run's.
    let names: Vec<&Value> = mode["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| &c["name"])
        .collect();
    assert!(
        names.contains(&&Value::from("gate equals database")),
        "{mode}"
    );
    assert!(
        names.contains(&&Value::from("a sold-out product accepts nothing")),
        "{mode}"
    );
    // Where it ran: the servers answer for their versions.
    assert!(
        r["meta"]["postgres"]["version"].is_string(),
        "{}",
        r["meta"]
    );
    assert!(r["meta"]["machine"]["memory_mib"].is_u64(), "{}", r["meta"]);
}

#[tokio::test]
async fn the_refusals_before_opening_mode_reads_the_counters_around_a_flood_before_the_sale() {
    let stack = FullStack::spawn(|_| {}).await;
    let mut cmd = command(&[
        "bench",
        "--scenario",
        "flood",
        "--modes",
        "refusals-before-opening",
        "--requests",
        "300",
        "--buyers",
        "100",
        "--concurrency",
        "8",
        "--max-seconds-per-mode",
        "60",
        "--max-idle-wait-secs",
        "0",
        "--orders-db-url",
        &stack.order_db_url,
        "--postgres-url",
        &flashsale_test_support::postgres_server_url(),
        "--redis-url",
        &flashsale_test_support::redis_url(),
        "--json",
    ]);
    cmd.env("FLASHSALE_PRODUCT_STOCK_URL", &stack.stock_url)
        .env("FLASHSALE_ORDER_URL", &stack.order_url);
    let run = output(cmd).await;
    let r = run.json();
    assert_eq!(r["passed"], true, "{r}");
    let mode = &r["modes"][0];
    assert_eq!(mode["accepted"], 0, "{mode}");
    assert_eq!(mode["refused"]["SALE_NOT_STARTED"], 300, "{mode}");
    let refusals = &mode["refusals"];
    assert_eq!(refusals["stretch"], "before the opening", "{refusals}");
    assert_eq!(refusals["refused"], 300, "{refusals}");
    for counter in ["pg.xact_commit", "redis.calls"] {
        assert!(
            refusals["net_per_refused"][counter].is_f64(),
            "{counter}: {refusals}"
        );
    }
    let names: Vec<&Value> = mode["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| &c["name"])
        .collect();
    assert!(
        names.contains(&&Value::from("nothing is sold before the opening")),
        "{mode}"
    );
}

/// The naive modes on `db` for 5 buyers × 8 requests and 10 units (per-user limit 1).
fn naive_args(db: &str) -> Vec<String> {
    let pg = flashsale_test_support::postgres_server_url();
    [
        "bench",
        "--naive-db",
        db,
        "--scenario",
        "big-sale",
        "--modes",
        "naive,naive-bare",
        "--requests",
        "40",
        "--buyers",
        "5",
        "--stock",
        "10",
        "--concurrency",
        "4",
        "--db-pool",
        "2",
        "--max-seconds-per-mode",
        "30",
        "--max-idle-wait-secs",
        "0",
        "--postgres-url",
        &pg,
        "--json",
    ]
    .iter()
    .map(|a| (*a).to_owned())
    .collect()
}

#[tokio::test]
async fn the_report_tells_where_the_cpu_went_per_process_and_on_the_machine() {
    let stack = FullStack::spawn(|_| {}).await;
    let me = format!("stack={}", std::process::id());
    // Empty RPCs for two seconds (the mode's bound stops it): long enough for CPU samples.
    let mut cmd = command(&[
        "bench",
        "--modes",
        "noop",
        "--requests",
        "1000000",
        "--concurrency",
        "4",
        "--max-seconds-per-mode",
        "2",
        "--max-idle-wait-secs",
        "0",
        "--service-pid",
        &me,
        "--json",
    ]);
    cmd.env("FLASHSALE_ORDER_URL", &stack.order_url);
    let run = output(cmd).await;
    let r = run.json();
    let noop = &r["modes"][0];
    let cpu = &noop["cpu"]["requests"];
    let window = cpu["window_s"].as_f64().unwrap();
    assert!((1.0..=4.0).contains(&window), "{cpu}");
    let machine = &cpu["machine"];
    let shares: f64 = ["busy_share", "idle_share", "steal_share"]
        .iter()
        .map(|k| machine[k].as_f64().unwrap())
        .sum();
    assert!((shares - 1.0).abs() < 0.01, "{cpu}");
    assert!(machine["busy_share"].as_f64().unwrap() > 0.0, "{cpu}");
    // The stack (this test process) answered the calls, the bench process made them.
    assert!(cpu["cores"]["stack"].as_f64().unwrap() > 0.0, "{cpu}");
    assert!(cpu["cores"]["bench"].as_f64().unwrap() > 0.0, "{cpu}");
    // The servers are listed, as a figure or, where no process of theirs is visible, null.
    let cores = cpu["cores"].as_object().unwrap();
    for server in ["postgresql", "redis", "rabbitmq"] {
        assert!(cores.contains_key(server), "{cpu}");
    }
    assert!(cpu.get("ms_per_accepted").is_none(), "{cpu}");
    // Every answered empty call counts as accepted: the intake is the whole run, and its CPU
    // per call is the gRPC stack's cost of one call, client and server.
    let per = &noop["cpu"]["intake"]["ms_per_accepted"];
    let (stack, bench, machine) = (
        per["stack"].as_f64().unwrap(),
        per["bench"].as_f64().unwrap(),
        per["machine"].as_f64().unwrap(),
    );
    assert!(stack > 0.0 && bench > 0.0, "{per}");
    // The machine's busy time holds both processes' (each is counted in whole ticks, and
    // the two are read apart, hence the slack).
    assert!(machine >= 0.9 * (stack + bench), "{per}");
}

#[tokio::test]
async fn rounds_repeat_the_modes_with_a_product_each_and_give_median_ratios() {
    let stack = FullStack::spawn(|_| {}).await;
    let mut cmd = command(&[
        "bench",
        "--modes",
        "noop,platform",
        "--rounds",
        "2",
        "--scenario",
        "big-sale",
        "--requests",
        "30",
        "--buyers",
        "30",
        "--stock",
        "10",
        "--concurrency",
        "4",
        "--max-seconds-per-mode",
        "30",
        "--max-idle-wait-secs",
        "0",
        "--json",
    ]);
    cmd.env("FLASHSALE_PRODUCT_STOCK_URL", &stack.stock_url)
        .env("FLASHSALE_ORDER_URL", &stack.order_url);
    let run = output(cmd).await;
    let r = run.json();
    assert_eq!(r["rounds"], 2, "{r}");
    let modes = r["modes"].as_array().unwrap();
    let seen: Vec<(u64, &str)> = modes
        .iter()
        .map(|m| {
            (
                m["round"].as_u64().unwrap(),
                &m["mode"].as_str().unwrap()[..5],
            )
        })
        .collect();
    assert_eq!(
        seen,
        [(1, "no-op"), (1, "platf"), (2, "no-op"), (2, "platf")],
        "{r}"
    );
    // Each round sold its own product out: 10 accepted and every one confirmed, twice.
    for platform in [&modes[1], &modes[3]] {
        assert_eq!(platform["accepted"], 10, "{platform}");
        assert_eq!(platform["saga"]["confirmed"], 10, "{platform}");
    }
    let by_round = r["ratios_by_round"].as_array().unwrap();
    assert_eq!(by_round.len(), 2, "{r}");
    let key = "platform/noop throughput";
    let (a, b) = (
        by_round[0][key].as_f64().unwrap(),
        by_round[1][key].as_f64().unwrap(),
    );
    let median = r["ratios"][key].as_f64().unwrap();
    // Of two rounds, the median is their mean (rounded to hundredths).
    assert!((median - (a + b) / 2.0).abs() <= 0.006, "{median} {a} {b}");
}

#[tokio::test]
async fn the_open_loop_modes_read_each_points_product_back_and_pass_their_checks() {
    let stack = FullStack::spawn(|_| {}).await;
    let naive_db = TestDatabase::create().await.unwrap();
    let mut cmd = command(&[
        "bench",
        "--modes",
        "open-loop-platform,open-loop-naive",
        "--open-loop-rates",
        "20,40",
        "--open-loop-secs",
        "1",
        "--naive-db",
        &naive_db.name,
        "--db-pool",
        "2",
        "--max-idle-wait-secs",
        "1",
        "--postgres-url",
        &flashsale_test_support::postgres_server_url(),
        "--redis-url",
        &flashsale_test_support::redis_url(),
        "--json",
    ]);
    cmd.env("FLASHSALE_PRODUCT_STOCK_URL", &stack.stock_url)
        .env("FLASHSALE_ORDER_URL", &stack.order_url);
    let run = output(cmd).await;
    let r = run.json();
    let curves = r["open_loop"].as_array().unwrap();
    assert_eq!(curves.len(), 2, "{r}");
    let names = |curve: &Value| -> Vec<String> {
        curve["checks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                assert_eq!(c["pass"], true, "{c}");
                c["name"].as_str().unwrap().to_owned()
            })
            .collect()
    };
    let platform = names(&curves[0]);
    assert_eq!(
        platform,
        [
            "units sold <= stock",
            "one unit per accepted call",
            "gate equals database"
        ]
        .repeat(2),
        "{r}"
    );
    let naive = names(&curves[1]);
    assert_eq!(naive.len(), 8, "four checks per rate point: {r}");
    assert!(
        naive
            .iter()
            .any(|n| n == "every accepted call wrote its order"),
        "{r}"
    );
    assert!(curves.iter().all(|c| c["passed"] == true), "{r}");
    assert_eq!(r["passed"], true, "{r}");
}
