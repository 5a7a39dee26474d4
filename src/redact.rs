//! Database addresses without their secrets, for every place one is shown:
//! errors, `Debug`, logs, the CLI's text and JSON, the dashboard.
//!
//! [`redact_url`] is the one function that does it. It errs on the side of
//! hiding: an address it cannot read with certainty loses more than its
//! password, never less.

/// `url` with every password replaced by `***`, for messages and logs.
///
/// Covers:
/// - the userinfo of a URL, whatever characters the password holds (`@`,
///   `:`, `/`, `?`, `#`, percent escapes): `postgres://app:p@ss@db/q`
///   becomes `postgres://app:***@db/q`. The userinfo ends at the *last* `@`,
///   so a password with a raw `@` or `/` is hidden whole;
/// - password parameters in a query string (`?user=a&password=s3cret`) or a
///   PostgreSQL `key=value` connection string (`host=db password='s e c'`):
///   every key holding `pass` or `pwd` (`password`, `sslpassword`,
///   `passwd`, `pwd`), in any case.
///
/// A string with neither is returned unchanged (a SQLite path).
///
/// ```
/// assert_eq!(
///     backlog::redact_url("mysql://root:p@ss/w0rd@db:3306/app"),
///     "mysql://root:***@db:3306/app"
/// );
/// assert_eq!(
///     backlog::redact_url("postgres://db/app?user=a&password=s3cret"),
///     "postgres://db/app?user=a&password=***"
/// );
/// assert_eq!(
///     backlog::redact_url("host=db user=a password='it''s' dbname=app"),
///     "host=db user=a password=*** dbname=app"
/// );
/// ```
pub fn redact_url(url: &str) -> String {
    mask_parameters(&mask_userinfo(url))
}

/// `scheme://user:secret@host...` → `scheme://user:***@host...`.
fn mask_userinfo(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    // The last '@' of the whole rest, not of the authority as a parser would
    // find it: a raw '/', '?' or '#' in a password would end the authority
    // early and show the password's tail. An '@' in the query string then
    // masks more than the password, which is the safe way to be wrong.
    let Some(at) = rest.rfind('@') else {
        return url.to_owned();
    };
    let (userinfo, host) = rest.split_at(at);
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***{host}"),
        None => url.to_owned(),
    }
}

/// Masks the value of every `KEY=value` whose key names a password, in a
/// query string (`&`-separated) or a `key=value` connection string
/// (space-separated, values optionally single-quoted).
fn mask_parameters(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(eq) = rest.find('=') {
        // The key: the run of key characters just before '=' (spaces
        // around '=' are allowed in connection strings).
        let before = rest[..eq].trim_end();
        let key_start = before
            .char_indices()
            .rev()
            .find(|&(_, c)| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
            .map_or(0, |(i, c)| i + c.len_utf8());
        let key = before[key_start..].to_ascii_lowercase();
        out.push_str(&rest[..=eq]);
        rest = &rest[eq + 1..];
        if !(key.contains("pass") || key.contains("pwd")) {
            continue;
        }
        let value = rest.trim_start();
        let skipped = rest.len() - value.len();
        let end = if let Some(quoted) = value.strip_prefix('\'') {
            quoted_end(quoted) + 1
        } else {
            value
                .find(|c: char| c == '&' || c == ';' || c == '#' || c.is_whitespace())
                .unwrap_or(value.len())
        };
        out.push_str("***");
        rest = &rest[skipped + end..];
    }
    out.push_str(rest);
    out
}

/// Where a single-quoted value (its opening quote already taken) ends:
/// just past its closing quote, `''` and `\'` being quotes inside it.
fn quoted_end(quoted: &str) -> usize {
    let bytes = quoted.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'\'' if bytes.get(i + 1) == Some(&b'\'') => i += 2,
            b'\'' => return i + 1,
            _ => i += 1,
        }
    }
    bytes.len()
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    /// Each form with the secret it must hide and what must stay readable.
    const FORMS: [(&str, &str, &str); 14] = [
        (
            "postgres://app:s3cret@db:5432/q?sslmode=require",
            "s3cret",
            "postgres://app:***@db:5432/q?sslmode=require",
        ),
        (
            "postgres://postgres:p@ss@host/x",
            "ss@host",
            "postgres://postgres:***@host/x",
        ),
        (
            "mysql://root:p@ss@host/db",
            "p@ss",
            "mysql://root:***@host/db",
        ),
        (
            "mysql://root:a:b:c@host/db",
            "a:b:c",
            "mysql://root:***@host/db",
        ),
        (
            "postgres://u:pa/ss@host/db",
            "pa/ss",
            "postgres://u:***@host/db",
        ),
        ("postgres://u:x/y@z@h/db", "x/y@z", "postgres://u:***@h/db"),
        (
            "postgresql://u:p%40ss%2Fw@h:5432/db",
            "p%40ss",
            "postgresql://u:***@h:5432/db",
        ),
        ("mysql://u:pa?ss#w@h/db", "pa?ss#w", "mysql://u:***@h/db"),
        (
            "postgres://host/x?user=postgres&password=s3cr3tpw",
            "s3cr3tpw",
            "postgres://host/x?user=postgres&password=***",
        ),
        (
            "mysql://h/db?PASSWORD=s3cr3tpw&x=1",
            "s3cr3tpw",
            "mysql://h/db?PASSWORD=***&x=1",
        ),
        (
            "postgres://h/db?sslpassword=k3y&password=s3cr3tpw",
            "s3cr3tpw",
            "postgres://h/db?sslpassword=***&password=***",
        ),
        (
            "host=db user=app password=s3cr3tpw dbname=q",
            "s3cr3tpw",
            "host=db user=app password=*** dbname=q",
        ),
        (
            "host=db password = 'it''s s3cr3t' dbname=q",
            "s3cr3t",
            "host=db password =*** dbname=q",
        ),
        (
            "mariadb://root:hunter2@127.0.0.1:1/app",
            "hunter2",
            "mariadb://root:***@127.0.0.1:1/app",
        ),
    ];

    #[test]
    fn no_password_survives_redaction_in_any_form() {
        for (url, secret, shown) in FORMS {
            let redacted = redact_url(url);
            assert!(!redacted.contains(secret), "{url} → {redacted}");
            assert_eq!(redacted, shown, "{url}");
        }
    }

    #[test]
    fn addresses_without_a_password_are_unchanged() {
        for url in [
            "postgres://app@db/q",
            "postgres://db:5432/q?sslmode=disable",
            "/var/lib/app/queue.db",
            "sqlite:app.db",
            "",
            "=",
            "password=",
            "host=h password='unterminated",
            "ключ=значение é=ü",
        ] {
            let redacted = redact_url(url);
            if url.contains("password=") {
                assert!(redacted.ends_with("password=***"), "{url} → {redacted}");
            } else {
                assert_eq!(redacted, url);
            }
        }
    }
}
