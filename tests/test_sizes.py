"""mmsoft_analysis.sizes.parse_size: the tools' ``HxW`` / ``N`` size option."""
import argparse

import pytest

from mmsoft_analysis.sizes import SizeError, parse_size


@pytest.mark.parametrize('text, size', [
    ('800x1333', (800, 1333)), ('64', (64, 64)), (' 512 X 683 ', (512, 683)),
    ('1x1', (1, 1))])
def test_accepted_sizes(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize('text', [
    '', 'x', '800x', 'x1333', '800x1333x3', '0', '0x64', '64x0', '-64', '64x-1',
    '+64', '6_4', '64.0', '800*1333', 'large'])
def test_rejected_sizes(text):
    with pytest.raises(SizeError) as info:
        parse_size(text)
    assert isinstance(info.value, argparse.ArgumentTypeError)
    assert isinstance(info.value, ValueError)
    assert str(info.value) == (f'size {text!r} is invalid; expected HxW '
                               '(or N for NxN), e.g. 800x1333.')


def test_argparse_shows_the_message(capsys):
    parser = argparse.ArgumentParser()
    parser.add_argument('--size', type=parse_size)
    assert parser.parse_args(['--size', '224']).size == (224, 224)
    with pytest.raises(SystemExit) as info:
        parser.parse_args(['--size', '224x'])
    assert info.value.code == 2
    assert "size '224x' is invalid; expected HxW" in capsys.readouterr().err
