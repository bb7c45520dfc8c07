use super::errors::status_code;

#[test]
fn reads_status_codes_from_messages() {
    let message = "Error performing GET http://h/b/k in 1ms - Server returned non-2xx status \
                   code: 400 Bad Request: <Error/>";
    assert_eq!(status_code(message), Some(400));
    assert_eq!(status_code("connection reset"), None);
}

fn settings(endpoint: &str, key: &str) -> super::S3Settings {
    super::S3Settings {
        endpoint: Some(endpoint.to_owned()),
        region: "us-east-1".to_owned(),
        credentials: super::Credentials::Static(super::TemporaryCredentials {
            access_key_id: key.to_owned(),
            secret_access_key: "secret".to_owned(),
            session_token: None,
            expiry: None,
        }),
        ca_bundle: None,
    }
}

/// The option a refused setting names; panics if it was accepted.
fn refused(settings: super::S3Settings) -> (String, String) {
    match super::S3::new(settings, crate::storage::RetryPolicy::default()) {
        Err(crate::error::Error::Config { option, message }) => (option, message),
        other => panic!("expected a config error, got {other:?}"),
    }
}

#[test]
fn an_endpoint_object_store_cannot_parse_is_refused_not_a_panic_at_the_first_read() {
    let (option, message) = refused(settings("http://[x]:9", "key"));
    assert_eq!(option, "s3_base_url");
    assert!(message.contains("not a valid URL"), "{message}");
    assert!(!message.contains("[x]"), "the URL is not echoed: {message}");
}

#[test]
fn credentials_outside_visible_ascii_are_refused_without_echoing_them() {
    let (option, message) = refused(settings("http://127.0.0.1:9", "AKIA\r\nX-Evil: 1"));
    assert_eq!(option, "access_key_id");
    assert!(message.contains("byte 4"), "{message}");
    assert!(!message.contains("AKIA"), "{message}");
    let mut with_token = settings("http://127.0.0.1:9", "key");
    if let super::Credentials::Static(keys) = &mut with_token.credentials {
        keys.session_token = Some("tok en".to_owned());
    }
    assert_eq!(refused(with_token).0, "session_token");
}

#[test]
fn aws_buckets_go_in_the_host_name_unless_a_dot_would_break_tls() {
    use super::client::virtual_hosted;
    assert!(virtual_hosted("my-bucket-01"));
    assert!(!virtual_hosted("my.dotted.bucket"));
    assert!(!virtual_hosted("Upper"));
    assert!(!virtual_hosted("ab"));
}

#[test]
fn a_ca_bundle_that_is_not_pem_is_refused() {
    let mut bad = settings("https://127.0.0.1:9", "key");
    bad.ca_bundle =
        Some(b"-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n".to_vec());
    assert_eq!(refused(bad).0, "ca_bundle");
}

#[test]
fn refreshing_signs_with_new_credentials_before_expiry_and_on_demand() {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, SystemTime};

    use object_store::CredentialProvider;

    struct Counting(AtomicU32, Duration);
    impl super::FetchCredentials for Counting {
        fn fetch(&self) -> crate::error::Result<super::TemporaryCredentials> {
            let n = self.0.fetch_add(1, Ordering::SeqCst);
            Ok(super::TemporaryCredentials {
                access_key_id: format!("AKID{n}"),
                secret_access_key: format!("secret{n}"),
                session_token: Some(format!("token{n}")),
                expiry: Some(SystemTime::now() + self.1),
            })
        }
    }
    let run = |lifetime: Duration| {
        let source = Arc::new(Counting(AtomicU32::new(0), lifetime));
        let mut settings = settings("http://127.0.0.1:9", "key");
        settings.credentials = super::Credentials::Provider(source.clone());
        let s3 = super::S3::new(settings, crate::storage::RetryPolicy::default()).unwrap();
        let signer = s3.context.signer.current();
        let keys = super::runtime::runtime().block_on(async {
            let first = signer.get_credential().await.unwrap().key_id.clone();
            let second = signer.get_credential().await.unwrap().key_id.clone();
            (first, second)
        });
        (keys, s3, signer, source)
    };
    // An hour's credentials are reused; their secret is scrubbed from messages from then on.
    let ((first, second), s3, signer, source) = run(Duration::from_secs(3600));
    assert_eq!((first.as_str(), second.as_str()), ("AKID0", "AKID0"));
    assert_eq!(s3.context.scrubber.clean("x secret0 y"), "x <redacted> y");
    // A refusal fetches anew, even of credentials fetched for the refused request itself; a
    // refusal of a request sent before that refresh reuses it.
    let sent = std::time::Instant::now();
    super::runtime::runtime().block_on(async {
        assert!(signer.refresh(sent).await);
        assert_eq!(signer.get_credential().await.unwrap().key_id, "AKID1");
        assert!(signer.refresh(sent).await);
        assert_eq!(signer.get_credential().await.unwrap().key_id, "AKID1");
    });
    assert_eq!(source.0.load(Ordering::SeqCst), 2);
    // Credentials about to expire are fetched again at every use.
    let ((first, second), ..) = run(Duration::from_secs(0));
    assert_eq!((first.as_str(), second.as_str()), ("AKID0", "AKID1"));
    // Fixed keys cannot be refreshed, so a refusal is final.
    let fixed = super::S3::new(
        settings("http://127.0.0.1:9", "key"),
        crate::storage::RetryPolicy::default(),
    )
    .unwrap();
    assert!(!super::runtime::runtime().block_on(
        fixed
            .context
            .signer
            .current()
            .refresh(std::time::Instant::now())
    ));
}
