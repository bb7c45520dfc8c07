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
        endpoint: endpoint.to_owned(),
        region: "us-east-1".to_owned(),
        access_key_id: key.to_owned(),
        secret_access_key: "secret".to_owned(),
        session_token: None,
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
    with_token.session_token = Some("tok en".to_owned());
    assert_eq!(refused(with_token).0, "session_token");
}
