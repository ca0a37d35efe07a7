"""Packaging for nac_lab, driven by settings.ini (nbdev 2 convention)."""
from configparser import ConfigParser
import setuptools

cfg = ConfigParser(delimiters=['='])
cfg.read('settings.ini', encoding='utf-8')
c = cfg['DEFAULT']
reqs = c.get('requirements', '').split()
dev = c.get('dev_requirements', '').split()
setuptools.setup(
    name=c['lib_name'], version=c['version'], description=c['description'],
    long_description=open('README.md', encoding='utf-8').read(), long_description_content_type='text/markdown',
    author=c['author'], author_email=c['author_email'], license='Apache-2.0',
    classifiers=['License :: OSI Approved :: Apache Software License', 'Programming Language :: Python :: 3'],
    url=c['git_url'], packages=setuptools.find_packages(include=['nac_lab', 'nac_lab.*']),
    include_package_data=True, python_requires='>=' + c['min_python'],
    install_requires=reqs, extras_require={'dev': dev},
    entry_points={'console_scripts': c['console_scripts'].split(), 'nbdev': [f"{c['lib_path']}={c['lib_path']}._modidx:d"]},
    zip_safe=False,
)
