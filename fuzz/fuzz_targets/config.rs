//! The config file (`/etc/reactor/config.yaml`, YAML or JSON): what `reactor run` does with
//! it before the node is touched, from the text to the settings each part runs with.
#![no_main]

use libfuzzer_sys::fuzz_target;
use reactor::config::Config;
use reactor::decide::cgroups::CgroupVersion;
use reactor::images::settings::ImageGcSettings;
use reactor::node::NodePlan;
use reactor::reactor::ReactorSettings;
use reactor_fuzz::one_line;

fuzz_target!(|data: &[u8]| {
    // `Config::load` reads the file as UTF-8 text; other bytes are refused by the read.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let config = match Config::from_yaml_reporting(text) {
        Ok((config, _ignored)) => config,
        Err(e) => return one_line("config", &e.to_string()),
    };
    // The settings the agent derives from an accepted config: refusals name the key.
    if let Err(e) = ReactorSettings::from_config(&config) {
        one_line("reactor settings", &e.to_string());
    }
    for version in [CgroupVersion::V1, CgroupVersion::V2] {
        if let Err(e) = NodePlan::from_config(&config, version, 1 << 30) {
            one_line("node plan", &e.to_string());
        }
    }
    if let Err(e) = ImageGcSettings::from_config(&config).validate() {
        one_line("image GC settings", &e.to_string());
    }
    // What `reactor config` prints (YAML) and the same config as JSON read back as they are.
    let yaml = config.to_yaml();
    let again = Config::from_yaml(&yaml)
        .unwrap_or_else(|e| panic!("the printed config does not load: {e}\n{yaml}"));
    assert_eq!(again, config, "YAML round trip\n{yaml}");
    let json = serde_json::to_string(&config).expect("a config serializes to JSON");
    let again = Config::from_yaml(&json)
        .unwrap_or_else(|e| panic!("the config as JSON does not load: {e}\n{json}"));
    assert_eq!(again, config, "JSON round trip\n{json}");
});
