"""``redisbuf acl NAME --role ROLE --user USER``: the ACL SETUSER line of a per-buffer
role (redisbuf/ops/acl.py says what each role can and cannot be kept from), printed, or
applied with ``--apply --url ADMIN_URL`` and a password from ``--password-file`` or a
prompt (never echoed, never printed)."""

from __future__ import annotations

import argparse
import getpass
from pathlib import Path
from typing import Any

from ..ops import acl
from ..store.connection import redacted
from ._common import CommandError, add_json_argument, add_url_argument, connect_args, emit, safe


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "acl",
        help="print (or apply) the ACL SETUSER line of a per-buffer role",
        description="Print the ACL SETUSER line that confines USER to buffer NAME in ROLE "
        "(actor: add; learner: sample and update priorities; operator: read only; admin: "
        "everything on that buffer). With --apply it runs it at --url (an admin user) and "
        "sets the password from --password-file or a prompt.",
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
    line = acl.setuser_line(args.name, args.role, args.user)
    document: dict[str, Any] = {"buffer": args.name, "role": args.role, "user": args.user,
                                "rules": rules, "applied": False}
    if args.apply:
        password = _password(args)
        client, url = connect_args(args, "redisbuf acl --apply")
        try:
            applied, omitted = acl.supported(client, rules)
            client.execute_command("ACL", "SETUSER", args.user, *applied, f">{password}")
        finally:
            client.close()
        document.update(applied=True, url=redacted(url), rules=applied, omitted=omitted)

    def text() -> str:
        if not args.apply:
            return safe(line)
        note = (f" without {' '.join(document['omitted'])} (unknown to that server)"
                if document["omitted"] else "")
        return f"{safe(line)}\napplied at {redacted(document['url'])}{note}"

    return emit(args, document, lambda out: out.print(text(), soft_wrap=True))
