"""``redisbuf acl NAME --role ROLE --user USER``: the ACL SETUSER line of a per-buffer
role (redisbuf/ops/acl.py says what each role can and cannot be kept from), printed, or
applied with ``--apply --url ADMIN_URL`` and a password from ``--password-file`` or a
prompt (never echoed, never printed).

The printed line works on the server it is printed for: with ``--url`` (or
``$REDISBUF_URL``) that server's (the rules it does not know left out, as ``--apply``
does); without, the newest servers' line, and the versions it works on are said on
stderr (``--json``: ``works_on``)."""

from __future__ import annotations

import argparse
import getpass
from pathlib import Path
from typing import Any

from ..ops import acl
from ..store.connection import redacted
from ._common import (
    CommandError,
    add_json_argument,
    add_url_argument,
    connect_args,
    emit,
    error_console,
    resolve_url,
    safe,
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "acl",
        help="print (or apply) the ACL SETUSER line of a per-buffer role",
        description="Print the ACL SETUSER line that confines USER to buffer NAME in ROLE "
        "(actor: add; learner: sample and update priorities; operator: read only; admin: "
        "everything on that buffer). With --url (or $REDISBUF_URL) the line is that "
        "server's (rules it does not know left out); without, the newest servers' (the "
        "versions it works on are said). With --apply it runs it at --url (an admin user) "
        "and sets the password from --password-file or a prompt.",
    )
    parser.add_argument("name", help="buffer name")
    parser.add_argument("--role", required=True, choices=acl.ROLES)
    parser.add_argument("--user", required=True, help="the ACL user to create or reset")
    parser.add_argument("--apply", action="store_true", help="run it at --url")
    parser.add_argument("--password-file", type=Path, help="file whose first line is the password")
    add_url_argument(parser)
    add_json_argument(parser)
    parser.set_defaults(func=run)


def _password(args: argparse.Namespace) -> str:
    if args.password_file is not None:
        try:
            lines = args.password_file.read_text().splitlines()
        except OSError as exc:
            raise CommandError(f"cannot read --password-file: {exc.strerror}") from None
        password = lines[0] if lines else ""
    else:
        password = getpass.getpass(f"password for ACL user {args.user}: ")
    if not password:
        raise CommandError("the password is empty")
    return password


def run(args: argparse.Namespace) -> int:
    from ..store.keys import validate_name

    try:
        validate_name(args.name)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    rules = acl.rules(args.name, args.role)
    document: dict[str, Any] = {"buffer": args.name, "role": args.role, "user": args.user,
                                "rules": rules, "applied": False}
    if args.apply or resolve_url(args):
        client, url = connect_args(args, "redisbuf acl --apply")
        try:
            rules, omitted = acl.supported(client, rules)
            version = client.info("server").get("redis_version", "?")
            document.update(rules=rules, omitted=omitted, url=redacted(url),
                            works_on=f"the server at {redacted(url)} (version {version})")
            if args.apply:
                password = _password(args)
                client.execute_command("ACL", "SETUSER", args.user, *rules, f">{password}")
                document.update(applied=True)
        finally:
            client.close()
    else:
        document["works_on"] = acl.works_on(rules)
    line = acl.setuser_line(args.name, args.role, args.user, rules)

    def text() -> str:
        note = (f" without {' '.join(document['omitted'])} (unknown to that server)"
                if document.get("omitted") else "")
        if args.apply:
            return f"{safe(line)}\napplied at {safe(document['url'])}{note}"
        # the line alone on stdout, to paste; for which servers on stderr
        error_console().print(f"for {safe(document['works_on'])}{note}"
                              + ("" if "url" in document else
                                 "; --url prints the line of a given server"),
                              soft_wrap=True)
        return safe(line)

    return emit(args, document, lambda out: out.print(text(), soft_wrap=True))
