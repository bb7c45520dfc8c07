use super::errors::status_code;

#[test]
fn reads_status_codes_from_messages() {
    let message = "Error performing GET http://h/b/k in 1ms - Server returned non-2xx status \
                   code: 400 Bad Request: <Error/>";
    assert_eq!(status_code(message), Some(400));
    assert_eq!(status_code("connection reset"), None);
}
