"""Packaging for genlab: everything is read from settings.ini (the nbdev 2 convention)."""
from configparser import ConfigParser
import setuptools

cfg = ConfigParser(delimiters=["="])
cfg.read("settings.ini")
cfg = cfg["DEFAULT"]

requirements = cfg.get("requirements", "").split()
dev_requirements = cfg.get("dev_requirements", "").split()
console_scripts = cfg.get("console_scripts", "").split()

setuptools.setup(
    name=cfg["lib_name"],
    version=cfg["version"],
    description=cfg["description"],
    author=cfg["author"],
    author_email=cfg["author_email"],
    license="Apache-2.0",
    python_requires=f">={cfg['min_python']}",
    packages=setuptools.find_packages(include=["genlab", "genlab.*"]),
    include_package_data=True,
    install_requires=requirements,
    extras_require={"dev": dev_requirements},
    entry_points={"console_scripts": console_scripts, "nbdev": [f"{cfg['lib_path']}={cfg['lib_path']}._modidx:d"]},
    zip_safe=False,
)
