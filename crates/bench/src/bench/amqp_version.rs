//! The broker's version for the bench report: AMQP 0-9-1 servers announce it in the
//! `connection.start` method they send right after the protocol header (server property
//! `version`). Reading that one frame is enough; the connection is then dropped.

use std::time::Duration;

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpStream,
};

/// Largest `connection.start` frame read (real ones are well under 1 KiB).
const MAX_FRAME: usize = 64 * 1024;

/// `host:port` of an `amqp://user:pass@host:port/vhost` URL (port 5672 when absent).
pub fn address(url: &str) -> Option<String> {
    let rest = url.strip_prefix("amqp://")?;
    let authority = rest.split('/').next()?;
    let host_port = authority.rsplit('@').next()?;
    if host_port.is_empty() {
        return None;
    }
    Some(
        if host_port.rsplit(':').next()?.parse::<u16>().is_ok() && host_port.contains(':') {
            host_port.to_owned()
        } else {
            format!("{host_port}:5672")
        },
    )
}

/// Asks the broker at `url` for its product and version, e.g. `RabbitMQ 3.10.8`.
pub async fn probe(url: &str, timeout: Duration) -> Option<String> {
    let addr = address(url)?;
    let read = async {
        let mut s = TcpStream::connect(addr).await.ok()?;
        s.write_all(b"AMQP\x00\x00\x09\x01").await.ok()?;
        let mut head = [0u8; 7];
        s.read_exact(&mut head).await.ok()?;
        let size =
            usize::try_from(u32::from_be_bytes([head[3], head[4], head[5], head[6]])).ok()?;
        if size > MAX_FRAME {
            return None;
        }
        // The payload and the frame-end octet.
        let mut payload = vec![0u8; size + 1];
        s.read_exact(&mut payload).await.ok()?;
        let mut frame = head.to_vec();
        frame.extend(payload);
        Some(frame)
    };
    let frame = tokio::time::timeout(timeout, read).await.ok()??;
    let props = server_properties(&frame)?;
    let version = props.iter().find(|(k, _)| k == "version")?.1.clone();
    let product = props
        .iter()
        .find(|(k, _)| k == "product")
        .map_or("AMQP", |(_, v)| v.as_str());
    Some(format!("{product} {version}"))
}

/// The string-valued server properties of a `connection.start` method frame; `None` when the
/// bytes are not one.
pub fn server_properties(frame: &[u8]) -> Option<Vec<(String, String)>> {
    let mut r = Reader(frame);
    // Frame header: type 1 (method), channel 0, payload size; then class 10, method 10.
    if r.u8()? != 1 || r.u16()? != 0 {
        return None;
    }
    let size = usize::try_from(r.u32()?).ok()?;
    let mut p = Reader(r.take(size)?);
    if r.u8()? != 0xCE || p.u16()? != 10 || p.u16()? != 10 {
        return None;
    }
    p.take(2)?; // protocol version major, minor
    let table_len = usize::try_from(p.u32()?).ok()?;
    let mut t = Reader(p.take(table_len)?);
    let mut out = Vec::new();
    while !t.0.is_empty() {
        let name_len = usize::from(t.u8()?);
        let name = String::from_utf8(t.take(name_len)?.to_vec()).ok()?;
        let kind = t.u8()?;
        match kind {
            b'S' => {
                let len = usize::try_from(t.u32()?).ok()?;
                let value = String::from_utf8_lossy(t.take(len)?).into_owned();
                out.push((name, value));
            }
            // Skipped values: nested tables, arrays and byte arrays carry their length.
            b'F' | b'A' | b'x' => {
                let len = usize::try_from(t.u32()?).ok()?;
                t.take(len)?;
            }
            b't' | b'b' | b'B' => {
                t.take(1)?;
            }
            b's' | b'u' => {
                t.take(2)?;
            }
            b'I' | b'i' | b'f' => {
                t.take(4)?;
            }
            b'D' => {
                t.take(5)?;
            }
            b'l' | b'L' | b'd' | b'T' => {
                t.take(8)?;
            }
            b'V' => {}
            _ => return None,
        }
    }
    Some(out)
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn long_string(name: &str, value: &str) -> Vec<u8> {
        let mut v = vec![u8::try_from(name.len()).unwrap()];
        v.extend(name.as_bytes());
        v.push(b'S');
        v.extend(u32::try_from(value.len()).unwrap().to_be_bytes());
        v.extend(value.as_bytes());
        v
    }

    fn start_frame(table: &[u8]) -> Vec<u8> {
        let mut payload = vec![0, 10, 0, 10, 0, 9];
        payload.extend(u32::try_from(table.len()).unwrap().to_be_bytes());
        payload.extend(table);
        payload.extend([0, 0, 0, 5]); // mechanisms (ignored)
        payload.extend(b"PLAIN");
        let mut f = vec![1, 0, 0];
        f.extend(u32::try_from(payload.len()).unwrap().to_be_bytes());
        f.extend(payload);
        f.push(0xCE);
        f
    }

    #[test]
    fn reads_product_and_version_past_other_values() {
        let mut table = vec![12];
        table.extend(b"capabilities");
        table.push(b'F');
        table.extend(3u32.to_be_bytes());
        table.extend([1, 2, 3]);
        table.extend([4]);
        table.extend(b"flag");
        table.extend([b't', 1]);
        table.extend(long_string("product", "RabbitMQ"));
        table.extend(long_string("version", "3.10.8"));
        let props = server_properties(&start_frame(&table)).unwrap();
        assert_eq!(
            props,
            [
                ("product".to_owned(), "RabbitMQ".to_owned()),
                ("version".to_owned(), "3.10.8".to_owned())
            ]
        );
    }

    #[test]
    fn garbage_is_not_a_start_frame() {
        assert_eq!(server_properties(b""), None);
        assert_eq!(server_properties(b"HTTP/1.1 400 Bad Request\r\n"), None);
        let good = start_frame(&long_string("version", "1"));
        assert_eq!(
            server_properties(&good[..good.len() - 1]),
            None,
            "no frame end"
        );
        let mut wrong_method = good.clone();
        wrong_method[10] = 11;
        assert_eq!(server_properties(&wrong_method), None);
        let mut bad_type = start_frame(&long_string("version", "1"));
        bad_type[7 + 6 + 4 + 8] = b'?';
        assert_eq!(server_properties(&bad_type), None);
        let mut too_long = start_frame(&long_string("version", "1"));
        too_long[7 + 6 + 3] = 200; // table length past the payload
        assert_eq!(server_properties(&too_long), None);
    }

    #[test]
    fn addresses_come_from_amqp_urls() {
        assert_eq!(
            address("amqp://guest:guest@127.0.0.1:5672/%2f").as_deref(),
            Some("127.0.0.1:5672")
        );
        assert_eq!(address("amqp://broker/").as_deref(), Some("broker:5672"));
        assert_eq!(address("amqp://u:p@h:5673").as_deref(), Some("h:5673"));
        assert_eq!(address("http://h:80/"), None);
        assert_eq!(address("amqp://"), None);
    }

    #[tokio::test]
    async fn the_local_broker_tells_its_version() {
        let url = flashsale_test_support::amqp_url();
        let v = probe(&url, Duration::from_secs(5)).await.unwrap();
        assert!(v.starts_with("RabbitMQ "), "{v}");
    }
}
