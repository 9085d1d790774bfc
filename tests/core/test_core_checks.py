"""miniai.core's one argument checker, folder probe and no-follow reader: the messages the old checkers wrote come out
of `check_arg` unchanged, the probe leaves nothing behind, and the reader never follows a link or hangs on a FIFO."""
import math, os, errno, threading
import numpy as np, pytest

from miniai.core import check_arg, writable_folder, read_nofollow, open_nofollow, UnsafeFileError

def message(*args, **kw):
    with pytest.raises((TypeError, ValueError)) as e: check_arg(*args, **kw)
    return e.type, str(e.value)

# (check_arg call, the message each module's own checker wrote before they shared check_arg)
SAME = [
    (lambda: check_arg(0, 'every', 'HooksCallback', lo=1, note='record every N-th training batch'),
     "HooksCallback: `every` must be an integer >= 1 (record every N-th training batch), got 0"),
    (lambda: check_arg(0, 'bins', 'ActivationStats', lo=1), "ActivationStats: `bins` must be an integer >= 1, got 0"),
    (lambda: check_arg(-1, 'skew_factor', 'check_statistics', kind='real', lo=0, none='no check'),
     "check_statistics: `skew_factor` must be a finite number >= 0 (None: no check), got -1"),
    (lambda: check_arg(-1, 'lr', 'SGD', kind='real', lo=0., note='learning rate', fmt='{owner}: Invalid {note}: {got} (`{name}` must be {rule})'),
     "SGD: Invalid learning rate: -1 (`lr` must be a finite number >= 0)"),
    (lambda: check_arg('10', 'max_saved_tensors', note='a negative one: no limit', fmt='{name} must be a whole number{paren}, not {got}'),
     "max_saved_tensors must be a whole number (a negative one: no limit), not '10' (str)"),
    (lambda: check_arg(-2, 'max_n', 'show_image_batch', lo=1, note='how many images to show'),
     "show_image_batch: `max_n` must be an integer >= 1 (how many images to show), got -2"),
]

@pytest.mark.parametrize('call,expected', SAME, ids=range(len(SAME)))
def test_the_old_messages_come_out_unchanged(call, expected):
    with pytest.raises(ValueError) as e: call()
    assert str(e.value) == expected

def test_a_wrong_type_is_both_a_type_and_a_value_error():
    for bad in ('3', True, None, 2.0, np.float64(2.0)):
        kind, msg = message(bad, 'every', 'HooksCallback', lo=1)
        assert issubclass(kind, TypeError) and issubclass(kind, ValueError) and '`every`' in msg and type(bad).__name__ in msg
    kind, _ = message(0, 'every', lo=1)
    assert kind is ValueError                                 # out of range: a ValueError only

def test_values_pass_through_as_plain_python_numbers():
    assert check_arg(np.int64(3), 'n') == 3 and type(check_arg(np.int64(3), 'n')) is int
    assert type(check_arg(np.float32(0.5), 'x', kind='real')) is float and check_arg(np.bool_(False), 'b', kind='bool') is False
    assert check_arg(None, 'max_samples', none='all samples') is None
    assert check_arg(1, 'x', kind='real', lo=0, hi=1) == 1.0 and check_arg(0, 'x', kind='real', lo=0, hi=1) == 0.0
    for bad, kw in [(1, dict(hi=1, hi_open=True)), (0, dict(lo=0, lo_open=True)), (math.nan, {}), (math.inf, {}), (10**400, {})]:
        assert message(bad, 'x', kind='real', **kw)[0] is ValueError
    assert math.isinf(check_arg(math.inf, 'x', kind='real', finite=False))

def test_the_folder_probe_makes_checks_and_cleans_up(tmp_path):
    out = writable_folder(tmp_path/'a'/'b')
    assert out.is_dir() and list(out.iterdir()) == []
    writable_folder(tmp_path/'c'/'d', keep=False)
    assert not (tmp_path/'c').exists()
    (tmp_path/'file').write_text('x')
    with pytest.raises(NotADirectoryError) as e: writable_folder(tmp_path/'file')
    assert e.value.strerror == 'a regular file, not a folder' and e.value.filename == str(tmp_path/'file')
    with pytest.raises(NotADirectoryError): writable_folder(tmp_path/'file'/'sub')
    os.symlink(tmp_path/'a', tmp_path/'link')
    with pytest.raises(NotADirectoryError, match='a symlink, not a folder'): writable_folder(tmp_path/'link', follow_symlinks=False)
    with pytest.raises(ValueError, match='`out` must name a folder'): writable_folder(' ', name='out')
    if os.geteuid() != 0:
        os.chmod(tmp_path/'a', 0o500)
        try:
            with pytest.raises(PermissionError): writable_folder(tmp_path/'a'/'new'/'deeper')
            assert not (tmp_path/'a'/'new').exists()
        finally: os.chmod(tmp_path/'a', 0o700)

def test_the_reader_refuses_links_fifos_folders_and_large_files(tmp_path):
    (tmp_path/'f.json').write_bytes(b'{"a": 1}')
    assert read_nofollow(tmp_path/'f.json') == b'{"a": 1}' and read_nofollow(tmp_path/'f.json', cap=8) == b'{"a": 1}'
    os.symlink(tmp_path/'f.json', tmp_path/'link')
    os.mkfifo(tmp_path/'fifo')
    cases = {'link': (errno.ELOOP, 'a symlink, not followed'), 'fifo': (errno.EINVAL, 'a FIFO, not a regular file'),
             '.': (errno.EISDIR, 'a folder, not a regular file')}
    for name, (no, why) in cases.items():
        t = threading.Thread(target=lambda: pytest.raises(UnsafeFileError, read_nofollow, tmp_path/name), daemon=True)
        t.start(); t.join(10)
        assert not t.is_alive(), f'{name}: the reader hung'
        with pytest.raises(UnsafeFileError) as e: read_nofollow(tmp_path/name)
        assert (e.value.errno, e.value.strerror) == (no, why) and isinstance(e.value, OSError)
    with pytest.raises(UnsafeFileError, match='8 bytes, more than the 7 allowed'): read_nofollow(tmp_path/'f.json', cap=7)
    with pytest.raises(FileNotFoundError): read_nofollow(tmp_path/'missing')
    with pytest.raises(UnsafeFileError): open_nofollow(tmp_path/'link', write=True)
    assert (tmp_path/'f.json').read_bytes() == b'{"a": 1}'            # the link's target was not opened for writing
    with open_nofollow(tmp_path/'lock', write=True) as f: f.write(b'1')
    assert (tmp_path/'lock').read_bytes() == b'1'

def test_a_wrong_type_prints_as_the_type_error_it_is():
    "The last line of the traceback a user reads names TypeError, not a private class, and the error is still caught as a ValueError too."
    import traceback
    from miniai.core import check_arg
    with pytest.raises(ValueError) as e: check_arg('x', 'bins', 'ActivationStats', lo=1)
    assert isinstance(e.value, TypeError)
    assert traceback.format_exception_only(e.value)[-1] == "TypeError: ActivationStats: `bins` must be an integer >= 1, got 'x' (str)\n"
