//! A fault-injecting HTTP/1.1 proxy on 127.0.0.1:0 in front of a real registry.
//!
//! One request per client connection (responses get `Connection: close`), so every
//! request can be matched against a scriptable plan of [`Rule`]s: drop the connection
//! after N request body bytes, cut the response body after N bytes, answer a status
//! (optionally with `Retry-After`) or any status, content type and body, or delay.
//! TLS ClientHellos get a 400, as from the plain-HTTP registry behind it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Debug, Clone)]
pub enum Fault {
    /// Forward the head and this many body bytes, then close both sides.
    Drop { after_bytes: usize },
    /// Answer this status instead of forwarding.
    Status { code: u16, retry_after: Option<u32> },
    /// Wait, then forward.
    Delay(Duration),
    /// Answer this status, `Content-Type` and body instead of forwarding (a registry or
    /// middlebox that answers something other than what was asked for).
    Respond {
        code: u16,
        content_type: String,
        body: Vec<u8>,
    },
    /// Forward the request, then pass the response head (with its original
    /// `Content-Length`) and only this many bytes of the response body, then close.
    DropResponse { after_bytes: usize },
}

impl Fault {
    /// [`Fault::Respond`] with a text body.
    pub fn respond(code: u16, content_type: &str, body: impl Into<Vec<u8>>) -> Fault {
        Fault::Respond {
            code,
            content_type: content_type.to_string(),
            body: body.into(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Rule {
    /// `None` matches any method.
    pub method: Option<String>,
    /// Substring of the request target.
    pub path_contains: String,
    pub fault: Fault,
    /// How many more requests it applies to; `None`: all.
    pub times: Option<usize>,
}

impl Rule {
    pub fn new(method: &str, path_contains: &str, fault: Fault) -> Rule {
        Rule {
            method: Some(method.to_string()),
            path_contains: path_contains.to_string(),
            fault,
            times: Some(1),
        }
    }

    pub fn always(mut self) -> Rule {
        self.times = None;
        self
    }
}

pub struct Proxy {
    pub port: u16,
    /// `127.0.0.1:PORT`, for image references.
    pub host: String,
    rules: Arc<Mutex<Vec<Rule>>>,
    log: Arc<Mutex<Vec<String>>>,
}

impl Proxy {
    /// Proxies to `127.0.0.1:upstream_port` until the test process exits.
    pub fn start(upstream_port: u16) -> Proxy {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind proxy");
        let port = listener.local_addr().unwrap().port();
        let rules: Arc<Mutex<Vec<Rule>>> = Arc::default();
        let log: Arc<Mutex<Vec<String>>> = Arc::default();
        let (r, l) = (rules.clone(), log.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let (r, l) = (r.clone(), l.clone());
                std::thread::spawn(move || {
                    let _ = handle(client, upstream_port, &r, &l);
                });
            }
        });
        Proxy {
            port,
            host: format!("127.0.0.1:{port}"),
            rules,
            log,
        }
    }

    pub fn add(&self, rule: Rule) {
        self.rules.lock().unwrap().push(rule);
    }

    pub fn clear(&self) {
        self.rules.lock().unwrap().clear();
    }

    /// `"METHOD target -> what happened"` per request so far.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// `{host}/{repository}`.
    pub fn repo(&self, repository: &str) -> String {
        format!("{}/{}", self.host, repository)
    }
}

fn take_fault(rules: &Mutex<Vec<Rule>>, method: &str, target: &str) -> Option<Fault> {
    let mut rules = rules.lock().unwrap();
    let i = rules.iter().position(|r| {
        r.method.as_deref().is_none_or(|m| m == method)
            && target.contains(&r.path_contains)
            && r.times != Some(0)
    })?;
    if let Some(n) = &mut rules[i].times {
        *n -= 1;
    }
    Some(rules[i].fault.clone())
}

fn read_head(reader: &mut impl BufRead) -> std::io::Result<Vec<String>> {
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let line = line.trim_end_matches(['\r', '\n']).to_string();
        if line.is_empty() {
            return Ok(lines);
        }
        lines.push(line);
    }
}

fn header<'a>(lines: &'a [String], name: &str) -> Option<&'a str> {
    lines.iter().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// Copies `n` bytes, stopping (and reporting `false`) after `limit` bytes.
fn copy_n(from: &mut impl Read, to: &mut impl Write, n: u64, limit: &mut Option<usize>) -> bool {
    let mut left = n;
    let mut buf = [0u8; 16 * 1024];
    while left > 0 {
        let mut want = buf.len().min(left as usize);
        if let Some(l) = limit {
            if *l == 0 {
                return false;
            }
            want = want.min(*l);
        }
        let Ok(got) = from.read(&mut buf[..want]) else {
            return false;
        };
        if got == 0 || to.write_all(&buf[..got]).is_err() {
            return false;
        }
        if let Some(l) = limit {
            *l -= got;
        }
        left -= got as u64;
    }
    true
}

fn handle(
    client: TcpStream,
    upstream_port: u16,
    rules: &Mutex<Vec<Rule>>,
    log: &Mutex<Vec<String>>,
) -> std::io::Result<()> {
    client.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut peek = [0u8; 1];
    if client.peek(&mut peek)? == 0 {
        return Ok(());
    }
    if peek[0] == 0x16 {
        // A TLS ClientHello: answered as a plain-HTTP server (the registry) answers it, so
        // clients that try TLS first (BuildKit's pusher, polyarch) see why and fall back.
        let _ = (&client).write_all(
            b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        );
        return Ok(());
    }
    let mut reader = BufReader::new(client.try_clone()?);
    let mut client_w = client.try_clone()?;
    let head = read_head(&mut reader)?;
    let mut parts = head[0].split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let target = parts.next().unwrap_or("").to_string();
    let fault = take_fault(rules, &method, &target);
    log.lock()
        .unwrap()
        .push(format!("{method} {target} -> {fault:?}"));

    let mut limit = None;
    let mut response_limit = None;
    match fault {
        Some(Fault::Status { code, retry_after }) => {
            let mut response = format!(
                "HTTP/1.1 {code} Injected\r\nContent-Type: application/json\r\nConnection: close\r\n"
            );
            if let Some(s) = retry_after {
                response.push_str(&format!("Retry-After: {s}\r\n"));
            }
            let body = format!(
                "{{\"errors\":[{{\"code\":\"{}\",\"message\":\"injected {code}\"}}]}}",
                if code == 429 {
                    "TOOMANYREQUESTS"
                } else {
                    "UNAVAILABLE"
                }
            );
            response.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
            // Drain a little of the body so the client sees the answer, not a reset.
            let _ = client_w.write_all(response.as_bytes());
            let _ = client_w.flush();
            let _ = client.shutdown(Shutdown::Write);
            let mut sink = Vec::new();
            let _ = reader.take(64 * 1024 * 1024).read_to_end(&mut sink);
            return Ok(());
        }
        Some(Fault::Respond {
            code,
            content_type,
            body,
        }) => {
            let head = format!(
                "HTTP/1.1 {code} Injected\r\nContent-Type: {content_type}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            let _ = client_w.write_all(head.as_bytes());
            let _ = client_w.write_all(&body);
            let _ = client_w.flush();
            let _ = client.shutdown(Shutdown::Write);
            let mut sink = Vec::new();
            let _ = reader.take(64 * 1024 * 1024).read_to_end(&mut sink);
            return Ok(());
        }
        Some(Fault::Delay(d)) => std::thread::sleep(d),
        Some(Fault::Drop { after_bytes }) => limit = Some(after_bytes),
        Some(Fault::DropResponse { after_bytes }) => response_limit = Some(after_bytes),
        None => {}
    }

    let upstream = TcpStream::connect((Ipv4Addr::LOCALHOST, upstream_port))?;
    let mut up_w = upstream.try_clone()?;
    let mut out = String::new();
    for line in &head {
        if line
            .split_once(':')
            .is_some_and(|(k, _)| k.trim().eq_ignore_ascii_case("connection"))
        {
            continue;
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str("Connection: close\r\n\r\n");
    up_w.write_all(out.as_bytes())?;

    let chunked = header(&head, "transfer-encoding").is_some_and(|v| v.contains("chunked"));
    let complete = if chunked {
        loop {
            let mut size_line = String::new();
            reader.read_line(&mut size_line)?;
            up_w.write_all(size_line.as_bytes())?;
            let size = u64::from_str_radix(size_line.trim().split(';').next().unwrap_or("0"), 16)
                .unwrap_or(0);
            if !copy_n(&mut reader, &mut up_w, size + 2, &mut limit) {
                break false;
            }
            if size == 0 {
                break true;
            }
        }
    } else {
        let length: u64 = header(&head, "content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        copy_n(&mut reader, &mut up_w, length, &mut limit)
    };
    if !complete {
        let _ = upstream.shutdown(Shutdown::Both);
        let _ = client.shutdown(Shutdown::Both);
        return Ok(());
    }

    // The response: head with Connection: close, then everything until upstream closes.
    let mut up_r = BufReader::new(upstream);
    let response = read_head(&mut up_r)?;
    let mut out = String::new();
    for line in &response {
        if line
            .split_once(':')
            .is_some_and(|(k, _)| k.trim().eq_ignore_ascii_case("connection"))
        {
            continue;
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str("Connection: close\r\n\r\n");
    client_w.write_all(out.as_bytes())?;
    match response_limit {
        Some(n) => {
            std::io::copy(&mut (&mut up_r).take(n as u64), &mut client_w)?;
        }
        None => {
            std::io::copy(&mut up_r, &mut client_w)?;
        }
    }
    client_w.flush()?;
    let _ = client.shutdown(Shutdown::Both);
    Ok(())
}
