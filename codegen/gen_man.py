#!/usr/bin/env python3
"""A man page (man(7) roff) for a swift-argument-parser executable, from the
`--experimental-dump-help` JSON it prints. swift-argument-parser's own
generate-manual plugin does this too, but it rebuilds the whole package in a
build of its own (over 10 minutes here), so `make install` reads the help the
installed binary already carries.

    gen_man.py BINARY SECTION > NAME.SECTION
"""
import datetime
import json
import subprocess
import sys


def escape(text):
    text = (text or "").replace("\\", "\\e").replace("-", "\\-")
    text = "".join(c if ord(c) < 128 else f"\\[u{ord(c):04X}]" for c in text)
    return "\n".join(("\\&" + line) if line.startswith((".", "'")) else line for line in text.split("\n"))


def flag_text(argument):
    names = []
    for name in argument.get("names", []):
        names.append(("-" if name["kind"] == "short" else "--") + name["name"])
    text = ", ".join(f"\\fB{escape(n)}\\fR" for n in names)
    if argument["kind"] == "positional":
        text = f"\\fI{escape(argument.get('valueName', ''))}\\fR"
    elif argument["kind"] == "option":
        text += f" \\fI{escape(argument.get('valueName', 'value'))}\\fR"
    if argument.get("isRepeating"):
        text += " ..."
    return text


def arguments_section(command, out):
    shown = [a for a in command.get("arguments", []) if a.get("shouldDisplay", True)]
    for argument in shown:
        out.append(".TP")
        out.append(flag_text(argument))
        body = argument.get("abstract", "")
        if argument.get("defaultValue") not in (None, ""):
            body += f" (default: {argument['defaultValue']})"
        if argument.get("allValues"):
            body += " One of: " + ", ".join(argument["allValues"]) + "."
        out.append(escape(body))


def command_section(command, path, out):
    if not command.get("shouldDisplay", True) or command["commandName"] == "help":
        return
    name = " ".join(path)
    out.append(f'.SS "{escape(name)}"')
    if command.get("abstract"):
        out.append(escape(command["abstract"]))
    if command.get("discussion"):
        out.append(".PP")
        out.append(escape(command["discussion"]))
    arguments_section(command, out)
    for sub in command.get("subcommands", []):
        command_section(sub, path + [sub["commandName"]], out)


def main():
    binary, section = sys.argv[1], sys.argv[2]
    info = json.loads(subprocess.run([binary, "--experimental-dump-help"], capture_output=True, text=True, check=True).stdout)
    root = info["command"]
    name = root["commandName"]
    date = datetime.date.today().isoformat()
    out = [f'.TH "{name.upper()}" "{section}" "{date}" "threadwire" "threadwire manual"', ".SH NAME",
           f"{escape(name)} \\- {escape(root.get('abstract', ''))}", ".SH SYNOPSIS",
           f"\\fB{escape(name)}\\fR" + (" \\fIsubcommand\\fR" if root.get("subcommands") else "") + " [\\fIoptions\\fR]"]
    if root.get("discussion"):
        out += [".SH DESCRIPTION", escape(root["discussion"])]
    if root.get("arguments"):
        out.append(".SH OPTIONS")
        arguments_section(root, out)
    subcommands = [s for s in root.get("subcommands", []) if s.get("shouldDisplay", True) and s["commandName"] != "help"]
    if subcommands:
        out.append(".SH COMMANDS")
        for sub in subcommands:
            command_section(sub, [name, sub["commandName"]], out)
    out += [".SH SEE ALSO", "threadwire(1), threadwire\\-server(1); README.md and docs/ in the source tree."]
    print("\n".join(out))


if __name__ == "__main__":
    main()
