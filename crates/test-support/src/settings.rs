//! Bad-input tables for a service's settings.

use flashsale_platform::config::Validate;

/// A setting's key, and a change that makes a valid configuration invalid there.
pub type Case<S> = (&'static str, fn(&mut S));

/// `valid` passes validation under `service_key`; each case's change to it must be refused
/// with an error that names the case's key.
pub fn each_is_refused_naming_its_key<S: Validate + Clone>(
    valid: &S,
    service_key: &str,
    cases: &[Case<S>],
) {
    if let Err(e) = valid.validate(service_key) {
        panic!("the valid settings are refused: {e}");
    }
    for (key, mutate) in cases {
        let mut s = valid.clone();
        mutate(&mut s);
        match s.validate(service_key) {
            Ok(()) => panic!("a bad {key} is accepted"),
            Err(e) => {
                let e = e.to_string();
                assert!(e.contains(key), "`{e}` does not name {key}");
            }
        }
    }
}
