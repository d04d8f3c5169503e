//! What the services' batchers did during a mode, read from their Prometheus `/metrics` before
//! and after it: per batcher (`flashsale_batch_*{batch="…"}`, see `flashsale_platform::batch`)
//! how many batches ran, how many calls they served, how long the oldest call of a batch waited
//! for it to start and how long it ran. They tell whether an accepted call waited for a free
//! slot or for the work itself. An endpoint that does not answer is left out, never an error.

use std::{collections::BTreeMap, time::Duration};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// Longest wait for one `/metrics` answer.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest `/metrics` answer read.
const MAX_BODY: u64 = 8 << 20;

/// One batcher's running totals.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Totals {
    pub batches: f64,
    pub calls: f64,
    pub wait_s: f64,
    pub run_s: f64,
}

/// The totals of every batcher of one endpoint, by batcher name.
pub type Snapshot = BTreeMap<String, Totals>;

/// One batcher over a mode.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchFigures {
    pub name: String,
    pub batches: u64,
    pub calls: u64,
    pub mean_calls: f64,
    pub mean_wait_ms: f64,
    pub mean_run_ms: f64,
}

impl BatchFigures {
    pub fn to_json(&self) -> Value {
        json!({
            "batch": self.name,
            "batches": self.batches,
            "calls": self.calls,
            "calls_per_batch": round2(self.mean_calls),
            "oldest_wait_ms": round3(self.mean_wait_ms),
            "run_ms": round3(self.mean_run_ms),
        })
    }

    pub fn text(&self) -> String {
        format!(
            "{}: {} batches, {:.1} calls each, oldest call waited {:.2} ms, ran {:.2} ms",
            self.name, self.batches, self.mean_calls, self.mean_wait_ms, self.mean_run_ms
        )
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The batch totals in one Prometheus text answer.
pub fn parse(text: &str) -> Snapshot {
    let mut out = Snapshot::new();
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let Some((metric, labels)) = series.split_once('{') else {
            continue;
        };
        let Some(name) = batch_label(labels) else {
            continue;
        };
        let t = out.entry(name.to_owned()).or_default();
        match metric {
            "flashsale_batch_size_count" => t.batches += value,
            "flashsale_batch_size_sum" => t.calls += value,
            "flashsale_batch_wait_seconds_sum" => t.wait_s += value,
            "flashsale_batch_run_seconds_sum" => t.run_s += value,
            _ => {}
        }
    }
    out.retain(|_, t| *t != Totals::default());
    out
}

/// The value of the `batch` label in `labels` (the text after `{`).
fn batch_label(labels: &str) -> Option<&str> {
    const KEY: &str = "batch=\"";
    let start = if labels.starts_with(KEY) {
        KEY.len()
    } else {
        labels.find(&format!(",{KEY}"))? + 1 + KEY.len()
    };
    let rest = &labels[start..];
    Some(&rest[..rest.find('"')?])
}

/// What each batcher did between two readings of each endpoint (one [`Snapshot`] per endpoint,
/// `None` where it did not answer). Only endpoints read both times count, and only where
/// their totals grew (a service restarted between the readings starts from zero); batchers
/// that ran no batch are left out.
pub fn between(before: &[Option<Snapshot>], after: &[Option<Snapshot>]) -> Vec<BatchFigures> {
    let mut diff = Snapshot::new();
    for (b, a) in before.iter().zip(after) {
        let (Some(b), Some(a)) = (b, a) else {
            continue;
        };
        for (name, a) in a {
            let b = b.get(name).copied().unwrap_or_default();
            if a.batches < b.batches || a.calls < b.calls {
                continue;
            }
            let d = diff.entry(name.clone()).or_default();
            d.batches += a.batches - b.batches;
            d.calls += a.calls - b.calls;
            d.wait_s += a.wait_s - b.wait_s;
            d.run_s += a.run_s - b.run_s;
        }
    }
    diff.iter()
        .filter_map(|(name, d)| {
            let batches = d.batches;
            if batches < 1.0 {
                return None;
            }
            let calls = d.calls;
            Some(BatchFigures {
                name: name.clone(),
                batches: batches.round() as u64,
                calls: calls.round().max(0.0) as u64,
                mean_calls: calls / batches,
                mean_wait_ms: d.wait_s * 1000.0 / batches,
                mean_run_ms: d.run_s * 1000.0 / batches,
            })
        })
        .collect()
}

/// The batch totals of each endpoint in `urls`, in order (`None`: it did not answer).
pub async fn scrape(urls: &[url::Url]) -> Vec<Option<Snapshot>> {
    let mut out = Vec::with_capacity(urls.len());
    for url in urls {
        out.push(fetch(url).await.map(|text| parse(&text)));
    }
    out
}

/// The body of a `200` answer to `GET url` (HTTP/1.0, so the server closes when done).
async fn fetch(url: &url::Url) -> Option<String> {
    let addrs = url.socket_addrs(|| None).ok()?;
    let host = url.host_str()?;
    let target = &url[url::Position::BeforePath..url::Position::AfterQuery];
    let get = async {
        let mut stream = tokio::net::TcpStream::connect(&addrs[..]).await.ok()?;
        let request =
            format!("GET {target} HTTP/1.0\r\nHost: {host}\r\nAccept: text/plain\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut raw = Vec::new();
        stream.take(MAX_BODY + 1).read_to_end(&mut raw).await.ok()?;
        // Cut off: its last line could be a number read short.
        if raw.len() as u64 > MAX_BODY {
            return None;
        }
        let text = String::from_utf8(raw).ok()?;
        let (head, body) = text.split_once("\r\n\r\n")?;
        let status = head.lines().next()?.split_whitespace().nth(1)?;
        (status == "200").then(|| body.to_owned())
    };
    tokio::time::timeout(SCRAPE_TIMEOUT, get).await.ok()?
}

/// Checks `--metrics-url` values: `http://host:port/path`.
pub fn parse_urls(raw: &[String]) -> anyhow::Result<Vec<url::Url>> {
    raw.iter()
        .filter(|s| !s.is_empty())
        .map(|s| {
            url::Url::parse(s)
                .ok()
                .filter(|u| u.scheme() == "http" && u.has_host())
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "--metrics-url must be an http://host:port/path URL (got {s:?})"
                    )
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "\
# TYPE flashsale_batch_size summary
flashsale_batch_size{batch=\"order_gate\",quantile=\"0.5\"} 9
flashsale_batch_size_sum{batch=\"order_gate\"} 100
flashsale_batch_size_count{batch=\"order_gate\"} 10
flashsale_batch_wait_seconds_sum{batch=\"order_gate\"} 0.01
flashsale_batch_run_seconds_sum{batch=\"order_gate\"} 0.02
flashsale_batch_size_sum{batch=\"idle\"} 7
flashsale_batch_size_count{batch=\"idle\"} 1
flashsale_orders_accepted_total 5
";

    const AFTER: &str = "\
flashsale_batch_size_sum{batch=\"order_gate\"} 1100
flashsale_batch_size_count{batch=\"order_gate\"} 110
flashsale_batch_wait_seconds_sum{batch=\"order_gate\"} 0.06
flashsale_batch_run_seconds_sum{batch=\"order_gate\"} 0.17
flashsale_batch_size_sum{batch=\"order_write\"} 480
flashsale_batch_size_count{batch=\"order_write\"} 20
flashsale_batch_wait_seconds_sum{batch=\"order_write\"} 0.03
flashsale_batch_run_seconds_sum{batch=\"order_write\"} 0.05
flashsale_batch_size_sum{batch=\"idle\"} 7
flashsale_batch_size_count{batch=\"idle\"} 1
";

    #[test]
    fn a_mode_gets_each_batchers_batches_calls_waits_and_runs_between_two_readings() {
        // `idle` ran no batch between the readings: it is left out.
        let figures = between(&[Some(parse(BEFORE))], &[Some(parse(AFTER))]);
        assert_eq!(figures.len(), 2, "{figures:?}");
        let gate = &figures[0];
        assert_eq!(
            (gate.name.as_str(), gate.batches, gate.calls),
            ("order_gate", 100, 1000)
        );
        assert!((gate.mean_calls - 10.0).abs() < 1e-9);
        assert!((gate.mean_wait_ms - 0.5).abs() < 1e-9, "{gate:?}");
        assert!((gate.mean_run_ms - 1.5).abs() < 1e-9, "{gate:?}");
        // New since the first reading: counted from zero.
        let write = &figures[1];
        assert_eq!((write.name.as_str(), write.batches), ("order_write", 20));
        assert!((write.mean_calls - 24.0).abs() < 1e-9);
        assert!((write.mean_run_ms - 2.5).abs() < 1e-9);
        assert_eq!(write.to_json()["calls_per_batch"], 24.0);
    }

    #[test]
    fn only_endpoints_read_both_times_and_totals_that_grew_count() {
        let (before, after) = (parse(BEFORE), parse(AFTER));
        // The first endpoint did not answer before the mode, the second not after it, the
        // third restarted (its totals fell): none of them says what the mode did.
        let figures = between(
            &[
                None,
                Some(before.clone()),
                Some(after.clone()),
                Some(before.clone()),
            ],
            &[
                Some(after.clone()),
                None,
                Some(before.clone()),
                Some(after.clone()),
            ],
        );
        assert_eq!(figures, between(&[Some(before)], &[Some(after)]));
    }

    #[test]
    fn the_batch_label_is_found_among_others_but_not_inside_another_name() {
        assert_eq!(batch_label("batch=\"a\"}"), Some("a"));
        assert_eq!(batch_label("service=\"x\",batch=\"b\"}"), Some("b"));
        assert_eq!(batch_label("sub_batch=\"c\"}"), None);
    }

    #[test]
    fn lines_that_are_not_batch_totals_are_ignored() {
        let s = parse(
            "flashsale_batch_size_sum 3\n\
             flashsale_batch_size_sum{batch=\"x\"} not-a-number\n\
             garbage\n\
             flashsale_other_sum{batch=\"y\"} 4\n",
        );
        assert!(s.is_empty(), "{s:?}");
    }

    #[test]
    fn metrics_urls_must_be_http_with_a_host() {
        assert!(parse_urls(&["http://127.0.0.1:9102/metrics".into()]).is_ok());
        for bad in [
            "https://h/metrics",
            "127.0.0.1:9102",
            "http://",
            "ftp://h/x",
        ] {
            let err = parse_urls(&[bad.to_owned()]).unwrap_err().to_string();
            assert!(err.contains("--metrics-url"), "{bad}: {err}");
        }
        assert!(parse_urls(&[String::new()]).unwrap().is_empty());
    }

    #[tokio::test]
    async fn scraping_reads_an_answering_endpoint_and_skips_one_that_is_down() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let up = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await.unwrap();
            let answer = format!("HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\n{AFTER}");
            s.write_all(answer.as_bytes()).await.unwrap();
        });
        // Bound and dropped: nothing listens there.
        let down = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        let urls = parse_urls(&[
            format!("http://{down}/metrics"),
            format!("http://{up}/metrics"),
        ])
        .unwrap();
        let snapshots = scrape(&urls).await;
        server.await.unwrap();
        assert!(snapshots[0].is_none(), "{snapshots:?}");
        let up = snapshots[1].as_ref().unwrap();
        assert_eq!(up.get("order_write").map(|t| t.batches), Some(20.0));
        assert_eq!(up.len(), 3, "{up:?}");
    }
}
