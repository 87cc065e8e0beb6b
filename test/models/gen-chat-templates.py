# Produces the expected prompts in chat-templates.json from chat-templates.cases.json with
# Python's jinja2 (3.1.6 here), configured exactly as dstack's TGI client and transformers do:
#   ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) + raise_exception global,
#   render(messages=..., add_generation_prompt=True, bos_token=..., eos_token=...).
# Run from the repo root:  python3 test/models/gen-chat-templates.py
import json, os
from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

here = os.path.dirname(os.path.abspath(__file__))
src = json.load(open(os.path.join(here, "chat-templates.cases.json")))

def raise_exception(message):
    raise TemplateError(message)

env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
env.globals["raise_exception"] = raise_exception
for case in src["cases"]:
    t = env.from_string(src["templates"][case["template"]])
    try:
        case["expected"] = t.render(messages=case["messages"], add_generation_prompt=True,
                                    bos_token=case["bos"], eos_token=case["eos"])
    except TemplateError as e:
        case["error"] = str(e)
json.dump(src, open(os.path.join(here, "chat-templates.json"), "w"), indent=2, ensure_ascii=False)
open(os.path.join(here, "chat-templates.json"), "a").write("\n")
