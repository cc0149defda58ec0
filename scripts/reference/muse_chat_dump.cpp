// muse_chat_dump: renders conversations through a chat template with llama.cpp 11434's own
// chat code (libllama-common: common_chat_templates_init + common_chat_templates_apply, the
// path llama-server takes), for hearth's Muse Glimmer template fixtures
// (scripts/fixtures/make_muse_chat_fixtures.py).
//
//   muse_chat_dump TEMPLATE.jinja BOS EOS CASES.json OUT.json
//
// CASES.json: [{"name", "messages", "tools"?, "chat_template_kwargs"?, "reasoning_effort"?}],
// each turned into common_chat_templates_inputs as llama-server's oaicompat_chat_params_parse
// does (messages/tools parsed by common_chat_{msgs,tools}_parse_oaicompat, kwargs JSON-dumped,
// "reasoning_effort" put into the kwargs, "none" turning thinking off), with
// add_generation_prompt and no BOS stripping. OUT.json: [{"name", "prompt"} or {"name", "error"}].
//
// The clock is fixed: time() below replaces libc's for this static binary, so the
// template's strftime_now sees 2026-03-14 (run with TZ=UTC).
#include "chat.h"

#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

using json = nlohmann::ordered_json;

static const time_t FIXED_NOW = 1773489600;  // 2026-03-14T12:00:00Z

extern "C" time_t time(time_t * t) {
    if (t) {
        *t = FIXED_NOW;
    }
    return FIXED_NOW;
}

static std::string read_file(const char * path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

int main(int argc, char ** argv) {
    if (argc != 6) {
        std::cerr << "usage: " << argv[0] << " TEMPLATE BOS EOS CASES.json OUT.json\n";
        return 2;
    }
    const std::string tmpl_src = read_file(argv[1]);
    auto tmpls = common_chat_templates_init(nullptr, tmpl_src, argv[2], argv[3]);
    const json cases = json::parse(read_file(argv[4]));
    json out = json::array();
    for (const auto & c : cases) {
        json rec = {{"name", c.at("name")}};
        try {
            common_chat_templates_inputs inputs;
            inputs.use_jinja = true;
            inputs.add_generation_prompt = true;
            // llama.cpp's own JSON type (common_json) takes the parsed values
            inputs.messages = common_chat_msgs_parse_oaicompat(common_json::parse(c.at("messages").dump()));
            if (c.contains("tools")) {
                inputs.tools = common_chat_tools_parse_oaicompat(common_json::parse(c.at("tools").dump()));
            }
            if (c.contains("chat_template_kwargs")) {
                for (const auto & [k, v] : c.at("chat_template_kwargs").items()) {
                    inputs.chat_template_kwargs[k] = v.dump();
                }
            }
            if (c.contains("reasoning_effort")) {
                const std::string effort = c.at("reasoning_effort");
                if (effort == "none") {
                    inputs.enable_thinking = false;
                    inputs.chat_template_kwargs.erase("reasoning_effort");
                } else if (!effort.empty()) {
                    inputs.chat_template_kwargs["reasoning_effort"] = json(effort).dump();
                }
            }
            rec["prompt"] = common_chat_templates_apply(tmpls.get(), inputs).prompt;
        } catch (const std::exception & e) {
            rec["error"] = e.what();
        }
        out.push_back(rec);
    }
    std::ofstream(argv[5]) << out.dump(1) << "\n";
    return 0;
}
