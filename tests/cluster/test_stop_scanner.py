"""Stop strings in serve (cluster/serve/requests.py's StopScanner): cut before the first stop
string, never stream part of one, and keep text that only looked like the start of one."""

from __future__ import annotations

from cluster.serve.requests import StopScanner


def feed_all(stops: list[str], pieces: list[str]) -> tuple[list[str], bool]:
    scanner = StopScanner(stops)
    sent: list[str] = []
    for piece in pieces:
        out, stopped = scanner.feed(piece)
        sent.append(out)
        if stopped:
            return sent, True
    sent.append(scanner.flush())
    return sent, False


def test_stop_string_split_across_pieces_is_cut_and_never_streamed() -> None:
    sent, stopped = feed_all(["END"], ["hello E", "N", "D and more"])
    assert stopped
    assert sent == ["hello ", "", ""]


def test_a_false_start_is_released_when_it_cannot_be_a_stop_string() -> None:
    sent, stopped = feed_all(["END"], ["an E", "ND", "x"])
    assert stopped and "".join(sent) == "an "
    sent, stopped = feed_all(["END"], ["an E", "Nx", " tail"])
    assert not stopped
    assert sent == ["an ", "ENx", " tail", ""]


def test_the_earliest_of_several_stop_strings_wins() -> None:
    sent, stopped = feed_all(["world", "lo"], ["hello world"])
    assert stopped and sent == ["hel"]


def test_no_stop_strings_streams_everything_at_once() -> None:
    sent, stopped = feed_all([], ["a", "b"])
    assert not stopped and sent == ["a", "b", ""]


def test_held_back_tail_comes_out_at_the_end() -> None:
    sent, stopped = feed_all(["STOP"], ["text ST"])
    assert not stopped and sent == ["text ", "ST"]
