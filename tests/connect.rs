//! `Queue::connect`: which URL opens which backend, and the errors of a URL
//! this build cannot serve. The password of a URL never shows in an error.

use backlog::{Error, NewJob, Queue};
use serde_json::json;

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[test]
fn a_sqlite_url_opens_the_file_like_open() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("q.db");
    for url in [
        format!("sqlite:{}", path.display()),
        format!("sqlite://{}", path.display()),
    ] {
        let queue = Queue::connect(&url)?;
        assert_eq!(queue.path(), Some(path.as_path()));
        queue.enqueue(NewJob::new("k", json!(1)))?;
    }
    assert_eq!(Queue::open(&path)?.counts()?[0].count, 2);
    Ok(())
}

#[test]
fn a_url_of_a_backend_left_out_of_the_build_names_the_feature() {
    let cases = [
        (
            "postgres://app:s3cret@db.example/q",
            "postgres",
            cfg!(feature = "postgres"),
        ),
        (
            "postgresql://app:s3cret@db.example/q",
            "postgres",
            cfg!(feature = "postgres"),
        ),
        (
            "mysql://app:s3cret@db.example/q",
            "mysql",
            cfg!(feature = "mysql"),
        ),
    ];
    for (url, feature, built) in cases {
        if built {
            println!("not checked for {feature}: this build has the feature");
            continue;
        }
        match Queue::connect(url) {
            Err(Error::FeatureDisabled { feature: named }) => {
                assert_eq!(named, feature);
                let message = Error::FeatureDisabled { feature: named }.to_string();
                assert!(message.contains(&format!("`{feature}`")), "{message}");
            }
            other => panic!("{url}: expected FeatureDisabled, got {other:?}"),
        }
    }
}

#[test]
fn an_unknown_scheme_is_invalid_argument_without_the_password() {
    for url in [
        "redis://app:s3cret@db.example/0",
        "http://app:s3cret@db.example/",
        "",
    ] {
        match Queue::connect(url) {
            Err(e @ Error::InvalidArgument(_)) => {
                let shown = format!("{e} {e:?}");
                assert!(!shown.contains("s3cret"), "{shown}");
            }
            other => panic!("{url:?}: expected InvalidArgument, got {other:?}"),
        }
    }
}
