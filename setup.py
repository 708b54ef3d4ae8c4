"""rlreason: RL of language models on verifiable reasoning tasks, in JAX."""

import setuptools

# Pinned to versions that resolve together on a CPU machine with Python 3.11 (Nov 2026).
INSTALL_REQUIRES = [
    'absl-py==2.5.1',
    'antlr4-python3-runtime==4.13.2',
    'bm25s==0.3.16',  # envs/search.py's BM25; needs only numpy.
    'chex==0.1.92',
    'flax==0.12.8',
    'gguf==0.19.0',  # model/gguf_file.py: llama.cpp's GGUF reader and dequantiser.
    'grain==0.2.18',
    'importlib_resources==7.1.0',  # tfds needs it without TensorFlow but does not declare it.
    'jax==0.10.2',
    'jaxlib==0.10.2',
    'jinja2==3.1.6',
    'latex2sympy2_extended==1.11.0',
    'math-verify[antlr4_13_2]==0.9.0',
    'ml-collections==1.1.0',
    'mpmath==1.3.0',
    'numpy==2.4.6',
    'optax==0.2.8',
    'orbax-checkpoint==0.12.8',
    'pyarrow==26.0.1',
    'pyyaml==6.0.4',  # gguf's dependency, pinned with it (as are requests and tqdm).
    'requests==2.34.2',
    'safetensors==0.8.0',
    'sentencepiece==0.2.3',
    'sympy==1.14.0',
    'tensorboardX==2.6.5',  # TensorBoard event files without TensorFlow.
    'tensorflow-datasets==4.9.10',
    'tokenizers==0.23.3',
    'tqdm==4.70.1',
]

EXTRAS_REQUIRE = {
    # The parity stack: transformers' PyTorch models are the reference the tests compare to.
    # torch is pinned to the CPU wheel; an unpinned torch pulls a multi-GB CUDA build.
    'test': [
        'pytest==9.2.0',
        'pytest-xdist==3.8.0',
        # A hang guard in `make test`: a test past 15 min fails with every thread's stack.
        'pytest-timeout==2.4.0',
        'torch==2.13.0',
        'transformers==5.24.0',
        # Loads the PEFT adapters adapter_export.save_peft writes (adapter_export_test);
        # accelerate is its dependency, pinned with it.
        'peft==0.21.2',
        'accelerate==1.15.0',
        # Executes colab/ notebooks in the suite.
        'ipykernel==7.4.0',
        'matplotlib==3.11.2',
        'nbclient==0.11.0',
        'nbformat==5.11.1',
        # The TPU compiler, for the AOT memory check on abstract TPU devices (launch_test).
        'libtpu==0.0.42.1',
        # A gs:// workdir end to end on an in-memory GCS server (workdir_paths_test).
        'gcsfs==2026.10.1',
        'google-cloud-storage==3.17.1',
        'gcp-storage-emulator==2026.7.19',
    ],
    # demo_report prints a `tensorboard --logdir` line: the viewer comes with the demo.
    'demo': ['matplotlib==3.11.2', 'tensorboard==2.21.0', 'tensorboard-data-server==0.7.2',
             'grpcio==1.85.3', 'Markdown==3.11.3', 'Werkzeug==3.1.9'],
    'launch': ['xmanager==0.8.5.post1'],
    # A gs:// workdir (workdir_paths.py): etils.epath's gs:// files go through gcsfs, orbax
    # lists checkpoint steps through google-cloud-storage (its arrays through TensorStore).
    'gcs': ['gcsfs==2026.10.1', 'google-cloud-storage==3.17.1'],
    # TPU runtime; on a CPU host libtpu also lets launch/aot_check.py compile for TPU topologies.
    'tpu': ['jax[tpu]==0.10.2', 'libtpu==0.0.42.1'],
    'colab': ['matplotlib==3.11.2', 'nbclient==0.11.0', 'nbformat==5.11.1', 'ipykernel==7.4.0'],
}

setuptools.setup(
    name='rlreason',
    version='0.1.0',
    description='Reinforcement learning of language models on verifiable reasoning tasks, in JAX.',
    license='Apache-2.0',
    python_requires='>=3.11',
    packages=setuptools.find_packages(include=['rlreason', 'rlreason.*']),
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS_REQUIRE,
)
