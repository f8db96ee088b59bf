"""make install-files: both binaries, bash/zsh/fish completions and man pages
under DESTDIR/PREFIX, from the debug build. The completions are the ones
swift-argument-parser generates (checked by running bash's), the man pages
list every subcommand and option the binaries' help has."""
import json
import shutil
import subprocess

from conftest import ROOT


def test_make_install_puts_binaries_completions_and_man_pages_in_place(tmp_path):
    subprocess.run(["make", "-s", "install-files", f"DESTDIR={tmp_path}", "PREFIX=/usr", "BIN_DIR=.build/debug"],
                   cwd=ROOT, check=True, capture_output=True, text=True)
    usr = tmp_path / "usr"
    for binary in ("threadwire", "threadwire-server"):
        installed = usr / "bin" / binary
        assert subprocess.run([str(installed), "--version"], capture_output=True, text=True).returncode == 0
        for completion in (usr / "share/bash-completion/completions" / binary, usr / "share/zsh/site-functions" / f"_{binary}",
                           usr / "share/fish/vendor_completions.d" / f"{binary}.fish"):
            assert completion.stat().st_size > 500, completion
        page = (usr / "share/man/man1" / f"{binary}.1").read_text()
        assert page.startswith(f'.TH "{binary.upper()}" "1"')
        help_info = json.loads(subprocess.run([str(installed), "--experimental-dump-help"], capture_output=True, text=True).stdout)
        for sub in help_info["command"].get("subcommands", []):
            if sub["commandName"] != "help":
                assert f'.SS "{binary} {sub["commandName"]}"'.replace("-", "\\-") in page, sub["commandName"]
        for argument in help_info["command"].get("arguments", []):
            if argument.get("shouldDisplay", True) and argument["kind"] != "positional":
                assert "\\-\\-" + argument["preferredName"]["name"].replace("-", "\\-") in page, argument["preferredName"]
        if shutil.which("groff"):
            lint = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z", str(usr / "share/man/man1" / f"{binary}.1")],
                                  capture_output=True, text=True)
            assert lint.returncode == 0 and lint.stderr == "", lint.stderr
    # bash completes the CLI's subcommands from the installed script.
    script = usr / "share/bash-completion/completions/threadwire"
    completed = subprocess.run(
        ["bash", "-c", f'source {script}; COMP_WORDS=(threadwire thread ""); COMP_CWORD=2; COMP_LINE="threadwire thread "; '
                       'COMP_POINT=18; _threadwire; echo "${COMPREPLY[@]}"'], capture_output=True, text=True, check=True)
    assert {"start", "fork", "revert", "list"} <= set(completed.stdout.split()), completed.stdout


def test_every_subcommand_and_option_has_help_text():
    def missing(command, path):
        if command.get("commandName") == "help":
            return []
        found = [] if command.get("abstract") else [f"{' '.join(path)} (the command)"]
        for argument in command.get("arguments", []):
            if argument.get("shouldDisplay", True) and not argument.get("abstract"):
                found.append(f"{' '.join(path)} {(argument.get('preferredName') or {}).get('name', argument.get('valueName'))}")
        for sub in command.get("subcommands", []):
            found += missing(sub, path + [sub["commandName"]])
        return found

    for binary in ("threadwire", "threadwire-server"):
        info = json.loads(subprocess.run([str(ROOT / ".build" / "debug" / binary), "--experimental-dump-help"],
                                         capture_output=True, text=True, check=True).stdout)
        assert missing(info["command"], [binary]) == [], f"{binary}: no help text"
