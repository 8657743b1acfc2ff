"""Writes the generated demo datasets (generators: ``tools/demo_data.py``;
commands: docs/training.md)."""
import argparse
import time

from demo_data import (DEFAULT_CLASSES, SHAPES, check_side_range, generate_ade_demo,
                       generate_classification_demo, generate_coco_demo)

#: Default COCO root, without and with --mixed-sizes.
COCO_ROOTS = {False: 'data/demo_coco/', True: 'data/demo_coco_mixed/'}
#: Default (min, max) image side of --mixed-sizes: aspect ratios 1:2 to 2:1.
MIXED_SIDE_RANGE = (96, 192)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Generate the demo datasets of random shape scenes.')
    parser.add_argument('kind', nargs='?', default='all',
                        choices=['coco', 'ade', 'cls', 'all'],
                        help='which dataset to write (default: all, which is '
                        'coco and ade)')
    parser.add_argument('--coco-root', default=None,
                        help='COCO-format dataset root (default: '
                        f'{COCO_ROOTS[False]}, or {COCO_ROOTS[True]} with '
                        '--mixed-sizes)')
    parser.add_argument('--ade-root', default='data/demo_ade/',
                        help='ADE20K-layout dataset root')
    parser.add_argument('--cls-root', default='data/demo_cls/',
                        help='classification dataset root')
    parser.add_argument('--num-train', type=int, default=None,
                        help='training images per dataset (default: 600, cls 400)')
    parser.add_argument('--num-val', type=int, default=None,
                        help='validation images per dataset (default: 100)')
    parser.add_argument('--seed', type=int, default=0, help='random seed')
    parser.add_argument('--img-size', type=int, nargs='+', default=None,
                        help='image side, or height and width (default: 160, '
                        'cls 64)')
    parser.add_argument('--mixed-sizes', action='store_true',
                        help='COCO only: draw each image\'s height and width '
                        'from --side-range instead of using --img-size')
    parser.add_argument('--side-range', type=int, nargs=2,
                        default=list(MIXED_SIDE_RANGE), metavar=('MIN', 'MAX'),
                        help='side range of --mixed-sizes (default: '
                        f'{MIXED_SIDE_RANGE[0]} {MIXED_SIDE_RANGE[1]})')
    parser.add_argument('--classes', nargs='+', default=list(DEFAULT_CLASSES),
                        choices=sorted(SHAPES),
                        help='shape classes (at least 3)')
    args = parser.parse_args(argv)
    if args.img_size is not None and (len(args.img_size) not in (1, 2)
                                      or min(args.img_size) < 32):
        parser.error('--img-size takes one or two values, each >= 32')
    if any(n is not None and n < 1 for n in (args.num_train, args.num_val)):
        parser.error('--num-train and --num-val must be >= 1')
    if args.mixed_sizes and args.kind != 'coco':
        parser.error(f'--mixed-sizes applies to the coco dataset only, got kind '
                     f'{args.kind!r}; run "generate_demo_data.py coco '
                     '--mixed-sizes"')
    try:
        check_side_range(args.side_range)
    except ValueError as error:
        parser.error(f'--side-range: {error}')
    if args.coco_root is None:
        args.coco_root = COCO_ROOTS[args.mixed_sizes]
    return args


#: kind -> (generator, argument holding its root, summary line with the
#: fields root, train and val (their statistics), classes and labels).
DATASETS = {
    'coco': (generate_coco_demo, 'coco_root',
             'COCO dataset in {root}: train {train[images]} images / '
             '{train[annotations]} objects, val {val[images]} images / '
             '{val[annotations]} objects, classes {classes}'),
    'ade': (generate_ade_demo, 'ade_root',
            'ADE20K-layout dataset in {root}: training {train[images]} images, '
            'validation {val[images]} images, labels {labels}'),
    'cls': (generate_classification_demo, 'cls_root',
            'classification dataset in {root}: train {train[images]} images, '
            'val {val[images]} images, classes {classes}'),
}


def main(argv=None) -> None:
    """Generates the requested datasets and prints a summary."""
    args = parse_args(argv)
    common = dict(seed=args.seed, classes=args.classes)
    for name in ('num_train', 'num_val'):
        if getattr(args, name) is not None:
            common[name] = getattr(args, name)
    if args.img_size is not None:
        common['img_size'] = tuple(args.img_size) * (3 - len(args.img_size))
    if args.mixed_sizes:
        common['img_side_range'] = tuple(args.side_range)
    kinds = ('coco', 'ade') if args.kind == 'all' else (args.kind, )
    for kind in kinds:
        generate, root_arg, summary = DATASETS[kind]
        start = time.time()
        root = getattr(args, root_arg)
        stats = generate(root, **common)  # train, val and (cls) classes
        line = summary.format(root=root, labels=['background'] + list(args.classes),
                              **{'classes': args.classes, **stats})
        print(f'{line} ({time.time() - start:.1f} s)')


if __name__ == '__main__':
    main()
