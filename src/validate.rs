//! Input checks that run before anything touches the database.
//!
//! Names are data: quotes, semicolons and `--` are fine (every value is bound
//! as a parameter, never spliced into SQL). What is rejected is what would be
//! unreadable or unprintable: empty names, names over [`MAX_NAME_BYTES`], and
//! control characters.

use serde_json::Value;

use crate::error::{Error, Result};

/// The one redaction, under the name the backends import.
pub(crate) use crate::redact::redact_url;

/// The longest queue name, kind or worker id, in bytes.
pub const MAX_NAME_BYTES: usize = 128;

/// The longest unique key, in bytes.
pub const MAX_UNIQUE_KEY_BYTES: usize = 1024;

/// The deepest JSON nesting accepted, matching serde_json's own decode limit so
/// that every stored payload can be read back.
pub const MAX_JSON_DEPTH: usize = 127;

/// Checks a queue name, job kind or worker id.
pub(crate) fn name(what: &'static str, value: &str) -> Result<()> {
    if value.is_empty() {
        return Err(Error::invalid_name(what, "must not be empty"));
    }
    if value.len() > MAX_NAME_BYTES {
        return Err(Error::invalid_name(
            what,
            format!(
                "{} bytes is over the {MAX_NAME_BYTES}-byte limit",
                value.len()
            ),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(Error::invalid_name(
            what,
            "must not contain control characters",
        ));
    }
    Ok(())
}

/// Checks a unique key: any text but NUL, up to [`MAX_UNIQUE_KEY_BYTES`].
pub(crate) fn unique_key(value: &str) -> Result<()> {
    const WHAT: &str = "unique key";
    if value.is_empty() {
        return Err(Error::invalid_name(WHAT, "must not be empty"));
    }
    if value.len() > MAX_UNIQUE_KEY_BYTES {
        return Err(Error::invalid_name(
            WHAT,
            format!(
                "{} bytes is over the {MAX_UNIQUE_KEY_BYTES}-byte limit",
                value.len()
            ),
        ));
    }
    if value.contains('\0') {
        return Err(Error::invalid_name(WHAT, "must not contain NUL"));
    }
    Ok(())
}

/// Checks that a JSON value nests no deeper than [`MAX_JSON_DEPTH`]. Iterative,
/// so a hostile value cannot overflow the stack here.
pub(crate) fn json_depth(value: &Value) -> Result<()> {
    let mut stack: Vec<(&Value, usize)> = vec![(value, 1)];
    while let Some((v, depth)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match v {
            Value::Array(items) => Box::new(items.iter()),
            Value::Object(map) => Box::new(map.values()),
            _ => continue,
        };
        if depth > MAX_JSON_DEPTH {
            return Err(Error::InvalidPayload(format!(
                "JSON nests deeper than {MAX_JSON_DEPTH} levels"
            )));
        }
        stack.extend(children.map(|c| (c, depth + 1)));
    }
    Ok(())
}

/// Encodes a payload, enforcing the size cap and the nesting limit.
pub(crate) fn payload(value: &Value, limit: usize) -> Result<String> {
    json_depth(value)?;
    let text = serde_json::to_string(value)?;
    payload_size(text.len(), limit)?;
    Ok(text)
}

/// Checks a payload's encoded size against the cap.
pub(crate) fn payload_size(size: usize, limit: usize) -> Result<()> {
    if size > limit {
        return Err(Error::PayloadTooLarge { size, limit });
    }
    Ok(())
}

/// The largest progress a handler may report, encoded as JSON: 64 KiB. It
/// is rewritten at every heartbeat while it changes, so it is meant for a
/// counter or a small partial result, not a payload.
pub const MAX_PROGRESS_BYTES: usize = 64 * 1024;

/// Encodes a handler's progress, enforcing [`MAX_PROGRESS_BYTES`] and the
/// nesting limit.
pub(crate) fn progress(value: &Value) -> Result<String> {
    json_depth(value)?;
    let text = serde_json::to_string(value)?;
    if text.len() > MAX_PROGRESS_BYTES {
        return Err(Error::ProgressTooLarge {
            size: text.len(),
            limit: MAX_PROGRESS_BYTES,
        });
    }
    Ok(text)
}

/// Parses raw JSON text, mapping every failure (syntax, depth) to `InvalidPayload`.
pub(crate) fn parse_json(text: &str) -> Result<Value> {
    serde_json::from_str(text).map_err(|e| Error::InvalidPayload(e.to_string()))
}

/// A table prefix or schema name: ASCII letters, digits and `_`, not
/// starting with a digit, at most 32 bytes. Such names need no quoting in any
/// of the three dialects, so they are spliced into SQL text safely.
pub(crate) fn identifier(what: &'static str, value: &str) -> Result<()> {
    let ok = !value.is_empty()
        && value.len() <= 32
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !value.as_bytes()[0].is_ascii_digit();
    if ok {
        Ok(())
    } else {
        Err(Error::invalid_name(
            what,
            format!(
                "{value:?} must be 1 to 32 ASCII letters, digits or '_', not starting with a digit"
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_with_sql_punctuation_are_data() {
        assert!(name("queue", "a'; DROP TABLE backlog_jobs; --").is_ok());
        assert!(name("queue", "emoji 📨").is_ok());
    }

    #[test]
    fn empty_long_and_control_names_are_rejected() {
        assert!(name("queue", "").is_err());
        assert!(name("queue", &"q".repeat(MAX_NAME_BYTES + 1)).is_err());
        assert!(name("kind", "a\nb").is_err());
        assert!(name("kind", "a\0b").is_err());
        assert!(name("kind", &"q".repeat(MAX_NAME_BYTES)).is_ok());
    }

    #[test]
    fn json_depth_limit_matches_serde_json() {
        let ok = "[".repeat(MAX_JSON_DEPTH) + &"]".repeat(MAX_JSON_DEPTH);
        let value: Value = serde_json::from_str(&ok).unwrap();
        assert!(json_depth(&value).is_ok());

        let mut deep = Value::Null;
        for _ in 0..=MAX_JSON_DEPTH {
            deep = Value::Array(vec![deep]);
        }
        assert!(matches!(json_depth(&deep), Err(Error::InvalidPayload(_))));
        let too_deep = "[".repeat(MAX_JSON_DEPTH + 1) + &"]".repeat(MAX_JSON_DEPTH + 1);
        assert!(parse_json(&too_deep).is_err());
    }
}
