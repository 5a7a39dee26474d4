//! A `postgres://` URL as libpq reads it: the driver's settings, and the
//! TLS modes rust-postgres does not know (`verify-ca`, `verify-full`,
//! `sslrootcert`), applied through a native-tls connector.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use postgres::config::SslMode;
use postgres::{Client, Config};
use postgres_native_tls::MakeTlsConnector;

use crate::error::{Error, Result};
use crate::options::QueueOptions;
use crate::validate::redact_url;

/// How a connection uses TLS, as libpq's `sslmode` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TlsMode {
    /// Never.
    Disable,
    /// When the server offers it, without checking its certificate. libpq's
    /// default, and so the default here.
    Prefer,
    /// Always, without checking the certificate (as libpq: encryption
    /// against eavesdropping, not against an impostor).
    Require,
    /// Always, with a certificate signed by a trusted root (the ones in
    /// `sslrootcert` only, else the system's), for any host name.
    VerifyCa,
    /// As `VerifyCa`, and the certificate must name the host connected to.
    VerifyFull,
}

impl TlsMode {
    fn parse(value: &str) -> Result<TlsMode> {
        Ok(match value {
            "disable" => TlsMode::Disable,
            "allow" | "prefer" => TlsMode::Prefer,
            "require" => TlsMode::Require,
            "verify-ca" => TlsMode::VerifyCa,
            "verify-full" => TlsMode::VerifyFull,
            other => {
                return Err(Error::InvalidArgument(format!(
                    "sslmode={other:?}: expected disable, prefer, require, verify-ca or \
                     verify-full"
                )))
            }
        })
    }

    /// What rust-postgres is told: it knows only disable, prefer and require,
    /// and leaves checking the certificate to the TLS connector.
    fn driver_mode(self) -> SslMode {
        match self {
            TlsMode::Disable => SslMode::Disable,
            TlsMode::Prefer => SslMode::Prefer,
            _ => SslMode::Require,
        }
    }
}

/// A parsed `postgres://` URL: the driver's config and the TLS connector.
#[derive(Clone)]
pub(crate) struct Target {
    pub config: Config,
    pub tls: MakeTlsConnector,
    pub tls_mode: TlsMode,
    /// The URL with its password masked, for messages.
    pub redacted: String,
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target")
            .field("url", &self.redacted)
            .field("tls_mode", &self.tls_mode)
            .finish_non_exhaustive()
    }
}

impl Target {
    /// Parses `url`. `sslmode` and `sslrootcert` are taken out of the query
    /// string and applied here; every other parameter goes to rust-postgres.
    pub(crate) fn parse(url: &str, options: &QueueOptions) -> Result<Target> {
        let mut target = Target::parse_for_client(url, options)?;
        if target.config.get_application_name().is_none() {
            target.config.application_name("backlog");
        }
        Ok(target)
    }

    /// [`Target::parse`] without naming the connections `backlog`: the
    /// application's own client (`backlog::postgres::connect`).
    pub(crate) fn parse_for_client(url: &str, options: &QueueOptions) -> Result<Target> {
        let redacted = redact_url(url);
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut kept = Vec::new();
        let mut mode = None;
        let mut root_cert = None;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "sslmode" => mode = Some(TlsMode::parse(&percent_decode(value))?),
                "sslrootcert" => root_cert = Some(percent_decode(value)),
                _ => kept.push(pair),
            }
        }
        let mut mode = mode.unwrap_or(TlsMode::Prefer);
        // As libpq: `require` with a root certificate verifies the chain.
        if mode == TlsMode::Require && root_cert.is_some() {
            mode = TlsMode::VerifyCa;
        }
        let driver_mode = match mode.driver_mode() {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            _ => "require",
        };
        kept.push(match driver_mode {
            "disable" => "sslmode=disable",
            "prefer" => "sslmode=prefer",
            _ => "sslmode=require",
        });
        let rebuilt = format!("{base}?{}", kept.join("&"));
        let mut config = Config::from_str(&rebuilt)
            .map_err(|e| Error::InvalidArgument(format!("bad PostgreSQL URL {redacted:?}: {e}")))?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(options.connect_timeout);
        }
        // A server that vanished without closing its sockets (a host down, a
        // network cut) would leave a call waiting for its answer for hours
        // (the kernel's keepalive default). TCP_USER_TIMEOUT closes a
        // connection whose request or keepalive probe the peer has not
        // acknowledged for 10 s, and keepalive probes after 10 s idle,
        // every 5 s, find a dead peer while a call waits for an answer:
        // about 20 s in all. The server's kernel acknowledges at once while
        // a statement runs, so neither cuts a long statement short. The
        // sync driver has no read timeout: a server that accepts packets
        // and never answers is not bounded here. URL values win.
        if !query_sets(query, "keepalives_idle") {
            config.keepalives(true);
            config.keepalives_idle(Duration::from_secs(10));
            if !query_sets(query, "keepalives_interval") {
                config.keepalives_interval(Duration::from_secs(5));
            }
            if !query_sets(query, "keepalives_retries") {
                config.keepalives_retries(3);
            }
        }
        if config.get_tcp_user_timeout().is_none() {
            config.tcp_user_timeout(Duration::from_secs(10));
        }
        let tls = tls_connector(mode, root_cert.as_deref())?;
        Ok(Target {
            config,
            tls,
            tls_mode: mode,
            redacted,
        })
    }

    /// Opens one connection.
    pub(crate) fn connect(&self) -> Result<Client> {
        Ok(self.config.connect(self.tls.clone())?)
    }
}

/// Whether the URL's query string sets `key`.
fn query_sets(query: &str, key: &str) -> bool {
    query
        .split('&')
        .any(|pair| pair.split_once('=').map_or(pair, |(k, _)| k) == key)
}

/// The TLS connector for `mode`, trusting `root_cert` (a PEM file) if given.
fn tls_connector(mode: TlsMode, root_cert: Option<&str>) -> Result<MakeTlsConnector> {
    let mut builder = native_tls::TlsConnector::builder();
    match mode {
        TlsMode::Disable | TlsMode::Prefer | TlsMode::Require => {
            builder.danger_accept_invalid_certs(true);
        }
        TlsMode::VerifyCa => {
            builder.danger_accept_invalid_hostnames(true);
        }
        TlsMode::VerifyFull => {}
    }
    if let Some(path) = root_cert {
        let pem = std::fs::read(path).map_err(|e| {
            Error::InvalidArgument(format!("sslrootcert {path:?} cannot be read: {e}"))
        })?;
        let cert = native_tls::Certificate::from_pem(&pem).map_err(|e| {
            Error::InvalidArgument(format!(
                "sslrootcert {path:?} is not a PEM certificate: {e}"
            ))
        })?;
        // As libpq: the file replaces the system's roots, not adds to them.
        builder.disable_built_in_roots(true);
        builder.add_root_certificate(cert);
    }
    let connector = builder
        .build()
        .map_err(|e| Error::Database(format!("TLS setup failed: {e}").into()))?;
    Ok(MakeTlsConnector::new(connector))
}

/// `%XX` escapes decoded (a path in a URL); anything malformed is kept as is.
fn percent_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                let (h, l) = (hex(h).unwrap_or(0), hex(l).unwrap_or(0));
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn sslmode_maps_to_the_driver_and_the_connector() -> Result<()> {
        let options = QueueOptions::default();
        let cases = [
            ("postgres://u@h/db", TlsMode::Prefer, SslMode::Prefer),
            (
                "postgres://u@h/db?sslmode=disable",
                TlsMode::Disable,
                SslMode::Disable,
            ),
            (
                "postgres://u@h/db?sslmode=require",
                TlsMode::Require,
                SslMode::Require,
            ),
            (
                "postgres://u@h/db?sslmode=verify-full",
                TlsMode::VerifyFull,
                SslMode::Require,
            ),
            (
                "postgres://u@h/db?connect_timeout=3&sslmode=verify-ca",
                TlsMode::VerifyCa,
                SslMode::Require,
            ),
        ];
        for (url, mode, driver) in cases {
            let target = Target::parse(url, &options)?;
            assert_eq!(target.tls_mode, mode, "{url}");
            assert_eq!(target.config.get_ssl_mode(), driver, "{url}");
        }
        let target = Target::parse("postgres://u@h/db?connect_timeout=3", &options)?;
        assert_eq!(
            target.config.get_connect_timeout(),
            Some(&Duration::from_secs(3))
        );
        Ok(())
    }

    #[test]
    fn a_bad_sslmode_or_url_is_a_typed_error_without_the_password() {
        let options = QueueOptions::default();
        let bad = Target::parse("postgres://u:s3cret@h/db?sslmode=sometimes", &options);
        assert!(matches!(bad, Err(Error::InvalidArgument(_))));
        let bad = Target::parse("postgres://u:s3cret@h/db?bogus=1", &options);
        match bad {
            Err(e @ Error::InvalidArgument(_)) => assert!(!e.to_string().contains("s3cret"), "{e}"),
            other => panic!("{other:?}"),
        }
        let missing = Target::parse("postgres://u@h/db?sslrootcert=/nonexistent.pem", &options);
        assert!(matches!(missing, Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn percent_escapes_in_paths_are_decoded() {
        assert_eq!(percent_decode("%2Fetc%2Fssl%20x.pem"), "/etc/ssl x.pem");
        assert_eq!(percent_decode("100%"), "100%");
    }
}
