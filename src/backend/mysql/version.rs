//! Which servers can run backlog: those with `SELECT .. FOR UPDATE SKIP
//! LOCKED`, MySQL 8.0.1 and later, MariaDB 10.6 and later (also where the
//! JSON_TABLE function the heartbeat joins on first appeared).

use crate::error::{Error, Result};

/// A server, as `SELECT VERSION()` describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Server {
    Mysql {
        major: u32,
        minor: u32,
        patch: Option<u32>,
    },
    Mariadb {
        major: u32,
        minor: u32,
    },
}

impl Server {
    /// Parses `VERSION()`: `8.0.36`, `8.0.36-0ubuntu0.22.04.1`, `9.1.0`,
    /// `10.11.6-MariaDB-0+deb12u1`, `11.4.2-MariaDB-log`, and the
    /// `5.5.5-10.6.12-MariaDB` form old replication handshakes used. A
    /// vendor build may leave the patch unnumbered (Aurora's
    /// `8.0.mysql_aurora.3.05.2`): `patch` is then `None`.
    pub(crate) fn parse(version: &str) -> Result<Server> {
        let unparsed =
            || Error::UnsupportedServer(format!("unrecognised server version {version:?}"));
        let mariadb = version.to_ascii_lowercase().contains("mariadb");
        let text = if mariadb {
            version.strip_prefix("5.5.5-").unwrap_or(version)
        } else {
            version
        };
        let mut parts = text.split(['.', '-']);
        let mut number = || parts.next().and_then(|p| p.parse::<u32>().ok());
        let major = number().ok_or_else(unparsed)?;
        let minor = number().ok_or_else(unparsed)?;
        Ok(if mariadb {
            Server::Mariadb { major, minor }
        } else {
            Server::Mysql {
                major,
                minor,
                patch: number(),
            }
        })
    }

    /// `Ok` for a server with `SKIP LOCKED`, [`Error::UnsupportedServer`]
    /// naming the minimum otherwise.
    pub(crate) fn check(self) -> Result<Server> {
        let supported = match self {
            // An unnumbered 8.0 patch is a vendor build, all from 8.0.23 on.
            Server::Mysql {
                major,
                minor,
                patch,
            } => (major, minor) > (8, 0) || (major == 8 && patch.is_none_or(|p| p >= 1)),
            Server::Mariadb { major, minor } => (major, minor) >= (10, 6),
        };
        if supported {
            Ok(self)
        } else {
            Err(Error::UnsupportedServer(format!(
                "{self} has no SELECT .. FOR UPDATE SKIP LOCKED: backlog needs MySQL 8.0.1 or \
                 later, or MariaDB 10.6 or later"
            )))
        }
    }

    pub(crate) fn is_mariadb(self) -> bool {
        matches!(self, Server::Mariadb { .. })
    }
}

impl std::fmt::Display for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Server::Mysql {
                major,
                minor,
                patch: Some(p),
            } => write!(f, "MySQL {major}.{minor}.{p}"),
            Server::Mysql { major, minor, .. } => write!(f, "MySQL {major}.{minor}"),
            Server::Mariadb { major, minor } => write!(f, "MariaDB {major}.{minor}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_versions_are_parsed_and_checked() {
        // (VERSION(), supported)
        let table = [
            ("8.0.36", true),
            ("8.0.1", true),
            ("8.0.0", false),
            ("8.0.0-dmr", false),
            ("8.0.36-0ubuntu0.22.04.1", true),
            ("8.0.35-27", true),
            ("8.4.0-log", true),
            ("9.1.0", true),
            ("8.0.mysql_aurora.3.05.2", true),
            ("5.7.44", false),
            ("5.7.44-log", false),
            ("5.6.51", false),
            ("10.11.6-MariaDB-0+deb12u1", true),
            ("10.11.19-MariaDB-0+deb12u1", true),
            ("10.6.12-MariaDB", true),
            ("5.5.5-10.6.12-MariaDB", true),
            ("5.5.5-10.5.22-MariaDB", false),
            ("10.5.22-MariaDB-log", false),
            ("10.3.39-MariaDB", false),
            ("11.4.2-MariaDB-log", true),
            ("12.0.1-MariaDB", true),
        ];
        for (version, supported) in table {
            let checked = Server::parse(version).and_then(Server::check);
            assert_eq!(checked.is_ok(), supported, "{version}: {checked:?}");
            if let Err(e) = checked {
                assert!(matches!(e, Error::UnsupportedServer(_)), "{version}: {e:?}");
            }
        }
        assert!(Server::parse("10.11.6-MariaDB")
            .map(Server::is_mariadb)
            .unwrap_or(false));
        assert!(!Server::parse("8.0.36")
            .map(Server::is_mariadb)
            .unwrap_or(true));
    }

    #[test]
    fn unrecognised_versions_are_unsupported_servers() {
        for version in ["", "MySQL", "eight", "8", "x.y.z"] {
            assert!(
                matches!(Server::parse(version), Err(Error::UnsupportedServer(_))),
                "{version}"
            );
        }
    }

    #[test]
    fn the_refusal_names_the_minimum_versions() {
        let message = Server::parse("10.5.22-MariaDB")
            .and_then(Server::check)
            .map(|_| String::new())
            .unwrap_or_else(|e| e.to_string());
        assert!(message.contains("MariaDB 10.5"), "{message}");
        assert!(message.contains("MariaDB 10.6 or later"), "{message}");
        assert!(message.contains("MySQL 8.0.1"), "{message}");
    }
}
